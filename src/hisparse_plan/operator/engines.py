"""The engine operator/ answers deployment questions for: the default engine, vLLM, whose plans
(`KVCachePlan`) the baseline, the bounds, the tuning, the deployments and the re-fit read. Its
planner, the block rules its plans were sized by, and the version its settings choose are
taken here, the one module of operator/ that names an engine; SGLang's capacity is asked
through `capacity --engine sglang` (cli/engines.py) instead."""

from __future__ import annotations

from hisparse_plan.models import PlanRequest
from hisparse_plan.models.layout import KVCacheLayout
from hisparse_plan.presets.settings import vllm_version as engine_version
from hisparse_plan.targets.vllm import plan as make_plan
from hisparse_plan.targets.vllm.platform import Platform, resolve_platform
from hisparse_plan.targets.vllm.rules.required import required_blocks, steady_blocks

__all__ = ["engine_layout", "engine_version", "make_plan", "required_blocks", "steady_blocks"]

BASELINE_PLATFORM = Platform((9, 0))
"""The GPU whose backends lay a request out when none is named (an H100/H200)."""


def engine_layout(request: PlanRequest) -> KVCacheLayout:
    """The device layout the engine resolves for `request`'s layers (vLLM 0.34 on compute
    capability 9.0, see docs/planning-rules.md#backends-and-layout)."""
    return resolve_platform(request, BASELINE_PLATFORM).layout.layout
