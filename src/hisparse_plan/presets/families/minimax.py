"""MiniMax: lightning-attention hybrids (refused) and MiniMax-M2 (full attention).

- `minimax` (MiniMax-M1, MiniMax-Text-01, `attn_type_list` of 0 = lightning and 1 = softmax
  attention): vLLM 0.34 no longer serves them (its MiniMax-Text-01 code was removed in 0.23), so
  there is no layer layout to plan; refused naming `attn_type_list`. SGLang 0.5.23 has no model
  class for them either.
- `minimax_m2` (MiniMax-M2): vLLM's `models/minimax_m2.py` builds full attention on every layer
  (`model.layers.{i}.self_attn.attn`, `num_key_value_heads` KV heads of `head_dim`; each slides
  by a model-wide `sliding_window` if the config has one, as a Llama layer does) and never reads
  `attn_type_list`: the config's list must say so (all 1), else it contradicts the code and is
  refused. SGLang's `srt/models/minimax_m2.py`: one pool.
"""

from __future__ import annotations

from hisparse_plan.presets.errors import ConfigError
from hisparse_plan.presets.families import base
from hisparse_plan.presets.families.dense import read_generic

SOFTMAX = 1
"""`attn_type_list`'s value for a softmax (full) attention layer."""


def refuse_lightning(fields: base.Fields, layers: int) -> base.Layout:
    field = "attn_type_list" if base.given(fields, "attn_type_list") else "layer_types"
    raise ConfigError(
        f"{field}: MiniMax lightning-attention hybrids (MiniMax-M1, MiniMax-Text-01) are not "
        "served by vLLM 0.34 (removed in 0.23), so there is no layer layout to plan",
        field=field,
    )


def read_minimax_m2(fields: base.Fields, layers: int) -> base.Layout:
    if base.given(fields, "attn_type_list"):
        types = base.layer_list(fields, "attn_type_list", layers)
        odd = [i for i, kind in enumerate(types) if kind != SOFTMAX]
        if odd:
            raise ConfigError(
                f"attn_type_list: vLLM's MiniMax-M2 code builds full attention on every layer; "
                f"this config says layer {odd[0]} is {types[odd[0]]!r} (1 is full attention)",
                field="attn_type_list",
            )
    layout = read_generic(fields, layers)
    return base.Layout(layout.kinds, ("attn_type_list", *layout.reads))


MINIMAX = base.Family(
    name="minimax",
    model_types=("minimax", "minimax_m1", "minimax_text_01"),
    architectures=("MiniMaxText01ForCausalLM", "MiniMaxM1ForCausalLM"),
    read=refuse_lightning,
    vllm="none (MiniMax-Text-01's code was removed in vLLM 0.23)",
)
MINIMAX_M2 = base.Family(
    name="minimax_m2",
    model_types=("minimax_m2",),
    architectures=("MiniMaxM2ForCausalLM",),
    read=read_minimax_m2,
    vllm="models/minimax_m2.py",
)
