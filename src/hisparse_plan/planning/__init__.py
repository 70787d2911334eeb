"""Pure planning: no I/O, no torch, the same request always gives the same plan."""

from hisparse_plan.planning.planner import plan

__all__ = ["plan"]
