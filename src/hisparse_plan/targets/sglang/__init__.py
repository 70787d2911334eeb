"""SGLang 0.5.23 as a planning target: the stages and common rules at the top, a concern a
subpackage. May import models, rules, targets/'s shared modules; a concern never a stage.

The pools, tensors and figures SGLang's own classes would allocate for a request, computed
without SGLang or torch, through named stages (pipeline.py: read, resolve, size, place, report),
by SGLang's own rules, one function each (entry point `plan_sglang`; `plan_traced` with each
stage's decisions).
"""

from hisparse_plan.targets.sglang.pipeline import (
    STAGE_TITLES,
    TracedPlan,
    plan_sglang,
    plan_traced,
)

plan = plan_sglang
"""The entry point under the name every target gives it (targets/registry.py)."""

__all__ = ["STAGE_TITLES", "TracedPlan", "plan", "plan_sglang", "plan_traced"]
