"""Moved: vLLM's planner is `hisparse_plan.targets.vllm` (the trace `hisparse_plan.targets.trace`).
This name re-exports what it held, with a DeprecationWarning."""

from hisparse_plan._moved import deprecated_path
from hisparse_plan.targets.trace import Decision, Trace
from hisparse_plan.targets.vllm import TracedPlan, plan, plan_traced

deprecated_path(__name__, "hisparse_plan.targets.vllm")

__all__ = ["Decision", "Trace", "TracedPlan", "plan", "plan_traced"]
