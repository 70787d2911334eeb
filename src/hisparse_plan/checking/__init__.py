"""`check_plan`: prove a plan sound (docs/planning-rules.md#invariants) and, given its
request, that it answers it."""

from __future__ import annotations

from collections.abc import Mapping

from hisparse_plan.checking.agreement import check_answers
from hisparse_plan.checking.geometry import (
    check_alignment,
    check_page_inside,
    check_state_alignment,
    prove_disjoint,
)
from hisparse_plan.checking.meaning import check_meaning
from hisparse_plan.checking.pools import check_pool_names, check_vllm_pools
from hisparse_plan.checking.sglang import check_sglang_plan
from hisparse_plan.checking.sizing import check_sizing
from hisparse_plan.checking.structure import check_structure
from hisparse_plan.checking.trains import pool_trains
from hisparse_plan.errors import PlanError, PlanInvariantError
from hisparse_plan.models import KVCachePlan, PlanRequest
from hisparse_plan.models.any_plan import Plan, load_plan
from hisparse_plan.models.sglang_plan import SGLangPlan
from hisparse_plan.views import LayerView, plan_views, pool_name, spec_of, stage_of, tensor_stage

__all__ = ["check_plan"]


def check_plan(
    plan: Plan | Mapping[str, object],
    *,
    request: PlanRequest | Mapping[str, object] | None = None,
) -> None:
    """Raise `PlanInvariantError` at the first broken invariant; return None for a sound plan.

    From the plan alone: placement, the meaning of every group, every derived number, and
    that no two pages share a byte they may not. With `request`, also that the plan is the one
    the request gives, naming the first field that differs. A mapping is validated first.

    Cost grows with layers and tensors, never with num_blocks, heads or page sizes: a
    10,000-layer plan with a million blocks is proved as fast as one with a single block.
    """
    plan = load_plan(plan)
    try:
        if isinstance(plan, SGLangPlan):
            check_sglang_plan(plan, request)
        else:
            _check(plan, request)
    except PlanInvariantError:
        raise
    except PlanError as error:
        # A rule shared with the planner refused part of the plan; callers catch
        # PlanInvariantError for every broken invariant.
        raise PlanInvariantError(str(error)) from error


def _check(plan: KVCachePlan, request: PlanRequest | Mapping[str, object] | None) -> None:
    specs = spec_of(plan)
    check_structure(plan, specs)
    check_meaning(plan)
    check_sizing(plan)
    stages = stage_of(plan)
    check_vllm_pools(
        check_pool_names(plan.pools, plan.tensors), plan.tensors, plan.host_pool,
        plan.device_pools, plan.num_blocks,
        [tensor_stage(plan, index, stages) for index in range(len(plan.tensors))],
    )
    views = plan_views(plan, specs)
    for view in views.values():
        check_alignment(view)
        check_state_alignment(view, specs[view.name][1])
    sizes = {(False, stage): (plan.num_blocks, pool.size)
             for stage, pool in enumerate(plan.device_pools)}
    if plan.host_pool is not None:
        sizes[True, 0] = (plan.host_pool.num_blocks, plan.host_pool.size)
    by_pool: dict[tuple[bool, int], list[LayerView]] = {pool: [] for pool in sizes}
    for view in views.values():
        by_pool[view.pool].append(view)
    trains = {pool: pool_trains(members) for pool, members in by_pool.items()}
    for (host_resident, stage), (num_blocks, size) in sizes.items():
        name = pool_name(plan, stage, host_resident)
        prove_disjoint(name, trains[host_resident, stage], num_blocks, size)
        for view in by_pool[host_resident, stage]:
            check_page_inside(view, name, size)
    if request is not None:
        check_answers(plan, request)
