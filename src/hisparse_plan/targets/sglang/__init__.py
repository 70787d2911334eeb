"""SGLang 0.5.23 as a planning target: the pools, tensors and figures its own classes would
allocate for a request, computed without SGLang or torch (entry point `plan_sglang`)."""

from hisparse_plan.targets.sglang.planner import plan_sglang

plan = plan_sglang
"""The entry point under the name every target gives it (targets/registry.py)."""

__all__ = ["plan", "plan_sglang"]
