"""HiSparse against the all-GPU baseline on the same GPU memory."""

from __future__ import annotations

from hisparse_plan.models import Capacity, KVCachePlan, PlanRequest
from hisparse_plan.models.base import Model, PositiveInt
from hisparse_plan.operator.baseline import BaselineCapacity, baseline_capacity
from hisparse_plan.operator.bounds import Binding, pool_bounds
from hisparse_plan.planning import plan as make_plan


class CapacityComparison(Model):
    hisparse: Capacity
    baseline: BaselineCapacity
    ratio: float | None
    """hisparse.max_concurrency / baseline.max_concurrency; None when the baseline holds no
    request at all."""
    binding: Binding
    """The pool that caps HiSparse's max_concurrency."""
    max_model_len: PositiveInt


def compare_plan(plan: KVCachePlan) -> CapacityComparison:
    baseline = baseline_capacity(plan)
    ratio = (
        plan.capacity.max_concurrency / baseline.max_concurrency
        if baseline.max_concurrency > 0
        else None
    )
    return CapacityComparison(
        hisparse=plan.capacity,
        baseline=baseline,
        ratio=ratio,
        binding=pool_bounds(plan).binding("max"),
        max_model_len=plan.workload.max_model_len,
    )


def compare(request: PlanRequest) -> CapacityComparison:
    """Plan `request` and set its capacity beside the baseline's."""
    return compare_plan(make_plan(request))
