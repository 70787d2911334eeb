"""ZAYA1 (`zaya`): every decoder layer keeps a convolution state beside its attention cache.

vLLM 0.34's `models/zaya.py`: `ZayaAttention` builds, in this order, `ZayaCCA` (a `MambaBase`
on the short-convolution backend, `model.layers.{i}.self_attn.qkv_proj`: its states in
`mamba_states.CcaGeometry`, from `num_attention_heads`, `num_key_value_heads`, `head_dim`,
`cca_time0` and `cca_time1`) and an `Attention` (`model.layers.{i}.self_attn.attn`,
`num_key_value_heads` KV heads of `head_dim`), which slides by `sliding_window` where
`layer_types[i]` is `hybrid_sliding` (no window: full) and is full where it is `hybrid`.
"""

from __future__ import annotations

from typing import Final

from hisparse_plan.presets.errors import ConfigError
from hisparse_plan.presets.families import base
from hisparse_plan.presets.mamba_states import CcaGeometry
from hisparse_plan.presets.regular import LayerKind

LAYER_TYPES: Final = ("hybrid", "hybrid_sliding")


def read_zaya(fields: base.Fields, layers: int) -> base.Layout:
    types = base.layer_list(fields, "layer_types", layers)
    unknown = sorted({str(value) for value in types} - set(LAYER_TYPES))
    if unknown:
        raise ConfigError(f"layer_types: ZAYA1's layers are {', '.join(LAYER_TYPES)} in vLLM's "
                          f"model code; got {', '.join(unknown)}", field="layer_types")
    window = base.given(fields, "sliding_window")
    kinds: list[LayerKind] = ["sliding_and_mamba" if kind == "hybrid_sliding" and window
                              else "full_and_mamba" for kind in types]
    why = "ZAYA1's CCA states are sized by it"
    states = CcaGeometry(
        num_heads=base.positive(fields, "num_attention_heads", why),
        num_kv_heads=base.positive(fields, "num_key_value_heads", why),
        head_dim=base.positive(fields, "head_dim", why),
        time0=base.positive(fields, "cca_time0", why),
        time1=base.positive(fields, "cca_time1", why),
        source="num_attention_heads, num_key_value_heads, head_dim, cca_time0, cca_time1",
    )
    return base.Layout(kinds, ("layer_types", "sliding_window"), states=states,
                       names={"mamba": "model.layers.{i}.self_attn.qkv_proj",
                              "state_first": True})


ZAYA = base.Family(
    name="zaya",
    model_types=("zaya",),
    architectures=("ZayaForCausalLM",),
    read=read_zaya,
    vllm="models/zaya.py",
)
