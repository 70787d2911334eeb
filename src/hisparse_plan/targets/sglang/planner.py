"""Moved: SGLang's planner is `hisparse_plan.targets.sglang.pipeline` (its stages read.py,
resolve.py, size.py, place.py, report.py). This name re-exports what it held, with a
DeprecationWarning."""

from hisparse_plan._moved import deprecated_path
from hisparse_plan.targets.sglang.defaults import MAMBA_CONV_DTYPE, MAMBA_SSM_DTYPE
from hisparse_plan.targets.sglang.pipeline import plan_sglang
from hisparse_plan.targets.sglang.settings import refuse_vllm_sections, sglang_settings

deprecated_path(__name__, "hisparse_plan.targets.sglang.pipeline")

__all__ = [
    "MAMBA_CONV_DTYPE",
    "MAMBA_SSM_DTYPE",
    "plan_sglang",
    "refuse_vllm_sections",
    "sglang_settings",
]
