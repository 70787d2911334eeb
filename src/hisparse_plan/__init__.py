"""hisparse_plan: where every byte of an LLM's KV cache lives, planned for vLLM and SGLang, for
regular models and for HiSparse sparse-MLA models (the full history in pinned host memory).

The names below are imported on first use, so that `import hisparse_plan.cli.launch` (the
command's first code) costs nothing: the command imports the rest inside its Ctrl-C guard.
"""

from __future__ import annotations

import importlib
import warnings
from typing import TYPE_CHECKING

__version__ = "0.1.0"

_HOMES: dict[str, str] = {
    **dict.fromkeys(
        ("CapacityError", "HisparsePlanError", "LayoutError", "PlanError", "PlanInvariantError",
         "PlanWarning", "UnsupportedRequestError"), "hisparse_plan.errors"),
    **dict.fromkeys(
        ("Capacity", "ChunkedLocalAttentionSpec", "DevicePool", "FullAttentionSpec",
         "HisparseHotSpec", "HisparseResidentSpec", "HostPool", "KVCacheGroup", "KVCacheLayout",
         "KVCachePlan", "KVCacheTensor", "MambaSpec", "MLASpec", "PipelineStage", "PlanRequest",
         "SlidingWindowMLASpec", "SlidingWindowSpec", "UniformTypeSpec", "Workload"),
        "hisparse_plan.models"),
    "check_plan": "hisparse_plan.checking",
    "Plan": "hisparse_plan.models.any_plan",
    "load_plan": "hisparse_plan.models.any_plan",
    **dict.fromkeys(("SGLangPlan", "SGLangSettings"), "hisparse_plan.models.engines"),
    "refit_after_warmup": "hisparse_plan.operator.refit",
    **dict.fromkeys(("plan", "plan_for_engine"), "hisparse_plan.targets"),
}
"""Each public name's module."""

if TYPE_CHECKING:
    from hisparse_plan import planning as planning  # the old name, read lazily below
    from hisparse_plan.checking import check_plan
    from hisparse_plan.errors import (
        CapacityError,
        HisparsePlanError,
        LayoutError,
        PlanError,
        PlanInvariantError,
        PlanWarning,
        UnsupportedRequestError,
    )
    from hisparse_plan.models import (
        Capacity,
        ChunkedLocalAttentionSpec,
        DevicePool,
        FullAttentionSpec,
        HisparseHotSpec,
        HisparseResidentSpec,
        HostPool,
        KVCacheGroup,
        KVCacheLayout,
        KVCachePlan,
        KVCacheTensor,
        MambaSpec,
        MLASpec,
        PipelineStage,
        PlanRequest,
        SlidingWindowMLASpec,
        SlidingWindowSpec,
        UniformTypeSpec,
        Workload,
    )
    from hisparse_plan.models.any_plan import Plan, load_plan
    from hisparse_plan.models.engines import SGLangPlan, SGLangSettings
    from hisparse_plan.operator.refit import refit_after_warmup
    from hisparse_plan.targets import plan, plan_for_engine
else:

    def __getattr__(name: str) -> object:
        if name == "planning":
            return _old_planning()
        home = _HOMES.get(name)
        if home is None:
            raise AttributeError(f"module 'hisparse_plan' has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        globals()[name] = value  # looked up once
        return value

    def _old_planning() -> object:
        """`hisparse_plan.planning`, vLLM's planner's old name, imported when first read."""
        from hisparse_plan._moved import deprecated_path

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # warned once below, at the reader
            module = importlib.import_module("hisparse_plan.planning")
        deprecated_path("hisparse_plan.planning", "hisparse_plan.targets.vllm", depth=1)
        return module


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})


__all__ = [
    "Capacity",
    "CapacityError",
    "ChunkedLocalAttentionSpec",
    "DevicePool",
    "FullAttentionSpec",
    "HisparseHotSpec",
    "HisparsePlanError",
    "HisparseResidentSpec",
    "HostPool",
    "KVCacheGroup",
    "KVCacheLayout",
    "KVCachePlan",
    "KVCacheTensor",
    "LayoutError",
    "MLASpec",
    "MambaSpec",
    "PipelineStage",
    "Plan",
    "PlanError",
    "PlanInvariantError",
    "PlanRequest",
    "PlanWarning",
    "SGLangPlan",
    "SGLangSettings",
    "SlidingWindowMLASpec",
    "SlidingWindowSpec",
    "UniformTypeSpec",
    "UnsupportedRequestError",
    "Workload",
    "__version__",
    "check_plan",
    "load_plan",
    "plan",
    "plan_for_engine",
    "refit_after_warmup",
]
