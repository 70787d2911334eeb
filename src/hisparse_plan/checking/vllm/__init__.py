"""The invariants of a vLLM plan: its groups' meaning, every derived number, its pools, its bytes.
May import what checking/ may (models, rules, views, targets) and checking/'s shared modules."""

from __future__ import annotations

from collections.abc import Mapping

from hisparse_plan.checking.agreement import check_answers
from hisparse_plan.checking.geometry import check_alignment, check_page_inside, prove_disjoint
from hisparse_plan.checking.pools import check_pool_names, check_vllm_pools
from hisparse_plan.checking.structure import check_structure
from hisparse_plan.checking.trains import pool_trains
from hisparse_plan.checking.vllm.host_placement import check_host_placement
from hisparse_plan.checking.vllm.kv_sharing import check_kv_sharing
from hisparse_plan.checking.vllm.meaning import check_meaning
from hisparse_plan.checking.vllm.sizing import check_sizing
from hisparse_plan.checking.vllm.states import check_state_alignment
from hisparse_plan.models import KVCachePlan, PlanRequest
from hisparse_plan.views import (
    LayerView,
    plan_views,
    pool_name,
    spec_of,
    stage_of,
    tensor_stage,
)


def check_vllm_plan(
    plan: KVCachePlan, request: PlanRequest | Mapping[str, object] | None
) -> None:
    """Raise `PlanInvariantError` at the first broken invariant of a vLLM plan."""
    specs = spec_of(plan)
    check_structure(plan, specs)
    check_kv_sharing(plan, specs, request)
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
    # After the proofs that hold for any placement: the one placement each host layout allows.
    check_host_placement(plan)
    if request is not None:
        check_answers(plan, request)
