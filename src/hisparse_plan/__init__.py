"""hisparse_plan: where every byte of a HiSparse sparse-attention KV cache lives."""

import warnings
from importlib import import_module
from types import ModuleType

from hisparse_plan._moved import deprecated_path
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
from hisparse_plan.models.sglang_plan import SGLangPlan
from hisparse_plan.models.sglang_settings import SGLangSettings
from hisparse_plan.operator.refit import refit_after_warmup
from hisparse_plan.targets import plan_for_engine
from hisparse_plan.targets.vllm import plan

__version__ = "0.1.0"

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


def __getattr__(name: str) -> ModuleType:
    """`hisparse_plan.planning`, vLLM's planner's old name, imported when first read."""
    if name != "planning":
        raise AttributeError(f"module 'hisparse_plan' has no attribute {name!r}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # warned once below, at the reader
        module = import_module("hisparse_plan.planning")
    deprecated_path("hisparse_plan.planning", "hisparse_plan.targets.vllm")
    return module
