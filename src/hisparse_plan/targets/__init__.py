"""Engine targets, one package each (`vllm/`, `sglang/`): a PlanRequest into that engine's plan.
A target may import models, rules and targets/'s shared modules, never another target.

`plan_for_engine` picks the target by the request's `engine`, from the one
table in `registry.py`; `plan` asks the default engine's (vLLM's) target, typed for its plan
(`hisparse_plan.plan`).
"""

from hisparse_plan.targets.registry import plan, plan_for_engine

__all__ = ["plan", "plan_for_engine"]
