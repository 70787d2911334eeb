"""OLMo-Hybrid (`olmo_hybrid`): Gated DeltaNet state layers beside full-attention layers.

vLLM 0.34's `models/olmo_hybrid.py`: `OlmoHybridDecoderLayer` builds, where `layer_types[i]`
is `linear_attention`, a Gated DeltaNet (`model.layers.{i}.linear_attn`, its states from the
`linear_*` fields by `MambaStateShapeCalculator.gated_delta_net_state_shape`, the model dtype),
else an `OlmoHybridAttention` (`model.layers.{i}.self_attn.attn`): full attention, no window,
`num_key_value_heads` KV heads (all `num_attention_heads` where it is unset) of `hidden_size /
num_attention_heads` elements, whatever `head_dim` says.
"""

from __future__ import annotations

from typing import Final

from hisparse_plan.presets.families import base
from hisparse_plan.presets.regular import LayerKind

KINDS: Final[dict[str, LayerKind]] = {
    "linear_attention": "linear", "full_attention": "full",
}


def read_olmo_hybrid(fields: base.Fields, layers: int) -> base.Layout:
    kinds = base.from_layer_types(fields, layers, KINDS, "OLMo-Hybrid")
    overrides: dict[str, object] = {"head_dim": None, "sliding_window": None}
    if fields.get("num_key_value_heads") is None:
        overrides["num_key_value_heads"] = fields.get("num_attention_heads")
    return base.Layout(kinds, ("layer_types", "sliding_window"), fields=overrides)


OLMO_HYBRID = base.Family(
    name="olmo_hybrid",
    model_types=("olmo_hybrid",),
    architectures=("OlmoHybridForCausalLM",),
    read=read_olmo_hybrid,
    vllm="models/olmo_hybrid.py",
)
