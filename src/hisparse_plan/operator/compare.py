"""HiSparse against the all-GPU baseline (its real regular plan) on the same GPU memory."""

from __future__ import annotations

from hisparse_plan.errors import UnsupportedRequestError
from hisparse_plan.models import Capacity, KVCachePlan, PlanRequest
from hisparse_plan.models.base import Model, PositiveInt
from hisparse_plan.operator.baseline import BaselineCapacity, baseline_capacity
from hisparse_plan.operator.bounds import Binding, pool_bounds
from hisparse_plan.operator.engines import make_plan


class CapacityComparison(Model):
    hisparse: Capacity
    baseline: BaselineCapacity
    ratio: float | None
    """hisparse.max_concurrency / baseline.max_concurrency; None when the baseline holds no
    request at all."""
    binding: Binding
    """The pool that caps HiSparse's max_concurrency."""
    max_model_len: PositiveInt


def compare_plan(plan: KVCachePlan, request: PlanRequest) -> CapacityComparison:
    """`plan` (HiSparse's plan of `request`) beside the regular plan of the same request."""
    if plan.host_pool is None:
        raise UnsupportedRequestError(
            "capacity compares a HiSparse plan against the same model without HiSparse; "
            "expected a request with hisparse settings, got a regular one (its plan already is "
            "the all-GPU plan: see `plan`, and `capacity --compare` for its deployments)",
            field="hisparse",
        )
    baseline = baseline_capacity(request)
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


def fitted_request(request: PlanRequest) -> PlanRequest:
    """`request` at the length its auto-fit finds, without auto-fit: so that HiSparse and its
    baseline (and every sweep point) are compared at one max_model_len. Unchanged without
    auto-fit."""
    if not request.model.auto_fit_max_model_len:
        return request
    data = request.model_dump(mode="json")
    data["model"]["max_model_len"] = make_plan(request).max_model_len
    data["model"]["auto_fit_max_model_len"] = False
    return PlanRequest.model_validate(data)


def compare(request: PlanRequest) -> CapacityComparison:
    """Plan `request` with HiSparse and without, and set their capacities side by side."""
    return compare_plan(make_plan(request), request)
