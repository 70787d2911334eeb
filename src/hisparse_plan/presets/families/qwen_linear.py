"""Qwen's Gated DeltaNet hybrids: Qwen3-Next and Qwen3.5 (dense and MoE).

vLLM 0.34's `models/qwen3_next.py` and `models/qwen3_5.py` build, per `layer_types`
(`full_attention` / `linear_attention`; without it every `full_attention_interval`-th layer
full), either attention (`model.layers.{i}.self_attn.attn`, `num_key_value_heads` KV heads of
`head_dim`) or a Gated DeltaNet (`model.layers.{i}.linear_attn`): a conv state `[kernel - 1,
(2 x linear_num_key_heads x linear_key_head_dim + linear_num_value_heads x
linear_value_head_dim) / tp]` in the model dtype and a recurrent state
`[linear_num_value_heads / tp, linear_value_head_dim, linear_key_head_dim]`, which for Qwen3.5
is in the config's `mamba_ssm_dtype` (vLLM's Qwen3_5ForConditionalGenerationConfig; Qwen3.5
ships float32), else the model dtype. Qwen3.5's multimodal wrapper keeps the language model under
`language_model.`. SGLang 0.5.23's `srt/models/qwen3_next.py` and `qwen3_5.py` keep the states in
its Mamba pool.
"""

from __future__ import annotations

from typing import Final

from hisparse_plan.models.dtypes import DTYPE_SIZE
from hisparse_plan.presets.errors import ConfigError
from hisparse_plan.presets.families import base
from hisparse_plan.presets.mamba_states import GatedDeltaNetGeometry

QWEN3_5_TYPES: Final = ("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text")
AUTO: Final = "auto"
"""vLLM's `mamba_ssm_cache_dtype` that keeps the model dtype."""
WHY: Final = "Qwen3.5's Gated DeltaNet geometry"


def _kinds(fields: base.Fields, layers: int, model: str) -> base.Layout:
    reads = ("layer_types", "full_attention_interval", "sliding_window")
    if base.given(fields, "layer_types"):
        kinds = base.from_layer_types(
            fields, layers, {"full_attention": "full", "linear_attention": "linear"}, model
        )
        return base.Layout(kinds, reads)
    every = base.integer(fields, "full_attention_interval", f"{model}'s full-attention interval")
    if every == 0:
        raise ConfigError("full_attention_interval: expected at least 1, got 0",
                          field="full_attention_interval")
    return base.Layout(base.every_nth(layers, every, "full", "linear"), reads)


def read_qwen3_next(fields: base.Fields, layers: int) -> base.Layout:
    """The kinds alone: the Gated DeltaNet follows the `linear_*` fields, which
    `RegularArchitecture` checks and reads (as for the Qwen3-Next preset)."""
    return _kinds(fields, layers, "Qwen3-Next")


def read_qwen3_5(fields: base.Fields, layers: int) -> base.Layout:
    layout = _kinds(fields, layers, "Qwen3.5")
    ssm = fields.get("mamba_ssm_dtype") or AUTO
    if ssm != AUTO and ssm not in DTYPE_SIZE:
        raise ConfigError(
            f"mamba_ssm_dtype: expected auto or one of {', '.join(DTYPE_SIZE)}, got {ssm!r}",
            field="mamba_ssm_dtype",
        )
    if "linear" not in layout.kinds:
        return layout
    geometry = GatedDeltaNetGeometry.model_validate({
        "num_key_heads": base.positive(fields, "linear_num_key_heads", WHY),
        "num_value_heads": base.positive(fields, "linear_num_value_heads", WHY),
        "key_head_dim": base.positive(fields, "linear_key_head_dim", WHY),
        "value_head_dim": base.positive(fields, "linear_value_head_dim", WHY),
        "conv_kernel": base.positive(fields, "linear_conv_kernel_dim", WHY),
        "ssm_dtype": None if ssm == AUTO else ssm,
        "source": "linear_*",
    })
    return base.Layout(layout.kinds, layout.reads, geometry)


QWEN3_NEXT = base.Family(
    name="qwen3_next",
    model_types=("qwen3_next",),
    architectures=("Qwen3NextForCausalLM",),
    read=read_qwen3_next,
    vllm="models/qwen3_next.py",
)
QWEN3_5 = base.Family(
    name="qwen3_5",
    model_types=QWEN3_5_TYPES,
    architectures=("Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM",
                   "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration"),
    read=read_qwen3_5,
    vllm="models/qwen3_5.py (Qwen3-Next's layers, models/qwen3_next.py)",
)
