"""Engine targets: each turns a PlanRequest into that engine's own plan, one package each
(`vllm/`, `sglang/`). `plan_for_engine` picks the target by the request's `engine`, from the one
table in `registry.py`."""

from hisparse_plan.targets.registry import plan_for_engine

__all__ = ["plan_for_engine"]
