"""Architectures vLLM 0.34 serves whose cache layout differs from plain attention but which no
family reads yet (found by references/vllm_family_sweep.py's registry sweep): each `model_type`
is refused by name with what vLLM's code builds, rather than read by the generic (Llama-like)
rule, which would plan attention layers that are not there.

The modules named are vLLM 0.34's (`model_executor/models/` unless a path says otherwise). SGLang
0.5.23 is not consulted: nothing is planned for these.
"""

from __future__ import annotations

from typing import Final

from hisparse_plan.presets.errors import ConfigError
from hisparse_plan.presets.families import base

BUILDS: Final[dict[str, str]] = {
    "qwen4_exp": "several state layouts, MLA and shared caches (vllm/models/qwen4_exp/)",
    "qwen4_exp_text": "several state layouts, MLA and shared caches (vllm/models/qwen4_exp/)",
    "glm5_next": "KDA state layers beside sparse MLA (vllm/models/glm5next/)",
    "longcat_flash": "MLA layers (longcat_flash.py), not checked against the MLA reader yet",
    "hy_v4": "MLA layers (vllm/models/hy_v4/), not checked against the MLA reader yet",
    "minimax_m3_vl": "sparse MLA layers (vllm/models/minimax_m3/)",
    "mimo_v2_flash": "sliding and full layers of their own geometry by hybrid_layer_pattern "
                     "(mimo_v2.py), not checked against a reader yet",
}
"""What vLLM's code builds, by model_type."""


def refuse_unplanned(fields: base.Fields, layers: int) -> base.Layout:
    model_type = str(fields.get("model_type"))
    raise ConfigError(
        f"model_type: vLLM 0.34's code for {model_type!r} builds {BUILDS[model_type]}, a "
        "layout the config reader does not lay out yet; refusing rather than planning "
        "attention layers that are not there",
        field="model_type",
    )


UNPLANNED = base.Family(
    name="unplanned",
    model_types=tuple(BUILDS),
    architectures=(
        "Qwen4ExpForCausalLM",
        "Qwen4ExpForConditionalGeneration", "Glm5NextForCausalLM",
        "Glm5NextForConditionalGeneration", "LongcatFlashForCausalLM", "HYV4ForCausalLM",
        "MiniMaxM3SparseForConditionalGeneration", "MiMoV2FlashForCausalLM",
    ),
    read=refuse_unplanned,
    vllm="see BUILDS",
)
