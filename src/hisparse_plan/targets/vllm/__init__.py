"""vLLM (0.33, 0.34) as a planning target: `plan(request)`, through named stages (pipeline.py),
by vLLM's own rules (rules/). May import models, rules and targets/'s shared modules.

`plan` decides the groups, pools, strides and offsets. Pure: no I/O, no
torch, the same request always gives the same plan.
"""

from hisparse_plan.targets.trace import Decision, Trace
from hisparse_plan.targets.vllm.pipeline import STAGE_TITLES, TracedPlan, plan, plan_traced

__all__ = ["STAGE_TITLES", "Decision", "Trace", "TracedPlan", "plan", "plan_traced"]
