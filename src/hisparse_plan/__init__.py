"""hisparse_plan: where every byte of an LLM's KV cache lives, planned for vLLM and SGLang, regular
and HiSparse sparse-MLA models alike. Its public names, imported lazily from any room.

The names below are imported on first use, so that `import hisparse_plan.cli.launch` (the
command's first code) costs nothing: the command imports the rest inside its Ctrl-C guard.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

_HOMES: dict[str, str] = {
    **dict.fromkeys(
        ("CapacityError", "HisparsePlanError", "LayoutError", "PlanError", "PlanInvariantError",
         "PlanWarning", "UnsupportedRequestError"), "hisparse_plan.errors"),
    **dict.fromkeys(
        ("Capacity", "ChunkedLocalAttentionSpec", "CrossAttentionSpec", "DevicePool",
         "FullAttentionSpec", "HisparseHotSpec", "HisparseResidentSpec", "HostPool",
         "KVCacheGroup", "KVCacheLayout", "KVCachePlan", "KVCacheTensor", "MambaSpec", "MLASpec",
         "PipelineStage", "PlanRequest", "SlidingWindowMLASpec", "SlidingWindowSpec",
         "UniformTypeSpec", "Workload"),
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
    # `X as X`: each name is this package's to export (`__all__` is built from _HOMES)
    from hisparse_plan.checking import check_plan as check_plan
    from hisparse_plan.errors import CapacityError as CapacityError
    from hisparse_plan.errors import HisparsePlanError as HisparsePlanError
    from hisparse_plan.errors import LayoutError as LayoutError
    from hisparse_plan.errors import PlanError as PlanError
    from hisparse_plan.errors import PlanInvariantError as PlanInvariantError
    from hisparse_plan.errors import PlanWarning as PlanWarning
    from hisparse_plan.errors import UnsupportedRequestError as UnsupportedRequestError
    from hisparse_plan.models import Capacity as Capacity
    from hisparse_plan.models import ChunkedLocalAttentionSpec as ChunkedLocalAttentionSpec
    from hisparse_plan.models import CrossAttentionSpec as CrossAttentionSpec
    from hisparse_plan.models import DevicePool as DevicePool
    from hisparse_plan.models import FullAttentionSpec as FullAttentionSpec
    from hisparse_plan.models import HisparseHotSpec as HisparseHotSpec
    from hisparse_plan.models import HisparseResidentSpec as HisparseResidentSpec
    from hisparse_plan.models import HostPool as HostPool
    from hisparse_plan.models import KVCacheGroup as KVCacheGroup
    from hisparse_plan.models import KVCacheLayout as KVCacheLayout
    from hisparse_plan.models import KVCachePlan as KVCachePlan
    from hisparse_plan.models import KVCacheTensor as KVCacheTensor
    from hisparse_plan.models import MambaSpec as MambaSpec
    from hisparse_plan.models import MLASpec as MLASpec
    from hisparse_plan.models import PipelineStage as PipelineStage
    from hisparse_plan.models import PlanRequest as PlanRequest
    from hisparse_plan.models import SlidingWindowMLASpec as SlidingWindowMLASpec
    from hisparse_plan.models import SlidingWindowSpec as SlidingWindowSpec
    from hisparse_plan.models import UniformTypeSpec as UniformTypeSpec
    from hisparse_plan.models import Workload as Workload
    from hisparse_plan.models.any_plan import Plan as Plan
    from hisparse_plan.models.any_plan import load_plan as load_plan
    from hisparse_plan.models.engines import SGLangPlan as SGLangPlan
    from hisparse_plan.models.engines import SGLangSettings as SGLangSettings
    from hisparse_plan.operator.refit import refit_after_warmup as refit_after_warmup
    from hisparse_plan.targets import plan as plan
    from hisparse_plan.targets import plan_for_engine as plan_for_engine
else:

    def __getattr__(name: str) -> object:
        home = _HOMES.get(name)
        if home is None:
            raise AttributeError(f"module 'hisparse_plan' has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        globals()[name] = value  # looked up once
        return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})


__all__ = sorted(["__version__", *_HOMES])
"""Every public name: `_HOMES`'s, each read from its home on first use."""
