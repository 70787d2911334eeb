"""Pure planning: no I/O, no torch, the same request always gives the same plan."""

from hisparse_plan.planning.pipeline import TracedPlan, plan, plan_traced
from hisparse_plan.planning.trace import Decision, Trace

__all__ = ["Decision", "Trace", "TracedPlan", "plan", "plan_traced"]
