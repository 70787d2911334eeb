"""LFM2 and LFM2-MoE: short-convolution layers with an attention layer every few.

vLLM 0.34's `models/lfm2.py` and `lfm2_moe.py` build layer i as attention when `layer_types[i]`
is `full_attention` (`model.layers.{i}.self_attn.attn`, `num_key_value_heads` KV heads of
`hidden_size / num_attention_heads` elements whatever `head_dim` says), else as a short
convolution (`model_executor/layers/mamba/short_conv.py`, `model.layers.{i}.short_conv`): one conv
state `[conv_L_cache - 1, width / tp]` in the model dtype, the width `conv_dim` for LFM2 and
`hidden_size` for LFM2-MoE; no recurrent state, no prefill checkpoints. transformers' configs
write `layer_types` out from `full_attn_idxs` (every layer attention without it).

SGLang 0.5.23 serves both (`srt/models/lfm2.py`, `lfm2_moe.py`, `configs/lfm2.py`): its Mamba
pool keeps the conv state alone (a Mamba-2 cache with `state_size` 0), which the SGLang target
does not plan (it plans a conv and a temporal state per layer).
"""

from __future__ import annotations

from typing import Final

from hisparse_plan.presets.errors import ConfigError
from hisparse_plan.presets.families import base
from hisparse_plan.presets.mamba_states import ShortConvGeometry
from hisparse_plan.presets.regular import LayerKind

LFM2_TYPES: Final[dict[str, LayerKind]] = {"full_attention": "full", "conv": "conv"}


def _kinds(fields: base.Fields, layers: int) -> list[LayerKind]:
    """`layer_types`, else transformers' reading of `full_attn_idxs`."""
    if base.given(fields, "layer_types"):
        return base.from_layer_types(fields, layers, LFM2_TYPES, "LFM2")
    if not base.given(fields, "full_attn_idxs"):
        raise ConfigError(
            "layer_types: missing, and no full_attn_idxs to derive it from; transformers' "
            "Lfm2Config would make every layer attention; add layer_types (or full_attn_idxs)",
            field="layer_types",
        )
    attention = fields["full_attn_idxs"]
    odd = ([attention] if not isinstance(attention, list) else
           [i for i in attention if not isinstance(i, int) or isinstance(i, bool)
            or not 0 <= i < layers])
    if odd:
        raise ConfigError(
            f"full_attn_idxs: expected a list of layer indices from 0 to {layers - 1}, got "
            f"{odd[0]!r}",
            field="full_attn_idxs",
        )
    return ["full" if i in attention else "conv" for i in range(layers)]


def read_lfm2(fields: base.Fields, layers: int) -> base.Layout:
    kinds = _kinds(fields, layers)
    geometry = None
    if "conv" in kinds:
        width = "hidden_size" if fields.get("model_type") == "lfm2_moe" else "conv_dim"
        geometry = ShortConvGeometry(
            conv_dim=base.positive(fields, width, "LFM2's short-convolution width"),
            conv_kernel=base.positive(fields, "conv_L_cache", "LFM2's short-convolution kernel"),
            source=f"{width}, conv_L_cache",
        )
    return base.Layout(kinds, ("layer_types", "full_attn_idxs"), geometry,
                  fields={"head_dim": None})


LFM2 = base.Family(
    name="lfm2",
    model_types=("lfm2", "lfm2_moe"),
    architectures=("Lfm2ForCausalLM", "Lfm2MoeForCausalLM", "Lfm2VlForConditionalGeneration"),
    read=read_lfm2,
    vllm="models/lfm2.py, models/lfm2_moe.py, models/lfm2_vl.py, layers/mamba/short_conv.py",
    sglang=base.SGLangRule(refusal=(
        "SGLang 0.5.23 serves LFM2 (srt/models/lfm2.py, lfm2_moe.py) keeping one conv state per "
        "short-convolution layer in its Mamba pool (no temporal state), which the SGLang target "
        "does not plan (it plans a conv and a temporal state per layer)")),
)
