"""`check_plan` for an SGLang plan: the pool invariants every version 2 plan keeps, then what
SGLang's pools mean (docs/plan-contract.md#sglang-plans)."""

from __future__ import annotations

from collections.abc import Mapping

from hisparse_plan.checking.pools import check_pool_names, check_ranged_tensors
from hisparse_plan.errors import PlanInvariantError
from hisparse_plan.models import PlanRequest
from hisparse_plan.models.sglang_plan import SGLangPlan


def check_sglang_plan(
    plan: SGLangPlan, request: PlanRequest | Mapping[str, object] | None
) -> None:
    """Raise `PlanInvariantError` at the first broken invariant of an SGLang plan."""
    pools = check_pool_names(plan.pools, plan.tensors)
    for index, tensor in enumerate(plan.tensors):
        if tensor.ranges is None:
            raise PlanInvariantError(
                f"tensors[{index}] has no page ranges; expected explicit ranges in an SGLang "
                "plan", tensor=index, layer=tensor.layers[0],
            )
    check_ranged_tensors(pools, plan.tensors)
