"""The engine operator/ answers deployment questions for: the default engine, vLLM, whose plans
(`KVCachePlan`) the baseline, the bounds, the tuning, the deployments and the re-fit read. Its
planner, the block rules its plans were sized by, and the version its settings choose are
taken here, the one module of operator/ that names an engine; SGLang's capacity is asked
through `capacity --engine sglang` (cli/engines.py) instead."""

from __future__ import annotations

from hisparse_plan.presets.settings import vllm_version as engine_version
from hisparse_plan.targets.vllm import plan as make_plan
from hisparse_plan.targets.vllm.rules.required import required_blocks, steady_blocks

__all__ = ["engine_version", "make_plan", "required_blocks", "steady_blocks"]
