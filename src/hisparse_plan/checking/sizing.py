"""The plan's numbers agree with the pools and workload it records (SPEC 5.7, 5.8, 5.10)."""

from __future__ import annotations

import math

from hisparse_plan.errors import PlanError, PlanInvariantError
from hisparse_plan.models import KVCachePlan
from hisparse_plan.planning.buckets import PlacedGroup, place
from hisparse_plan.planning.capacity import hisparse_capacity
from hisparse_plan.planning.pools import (
    device_bytes_per_block,
    host_block_stride,
    host_blocks_needed,
)


def check_sizing(plan: KVCachePlan) -> None:
    placed = [place(group) for group in plan.groups]
    source = next((p for p in placed if p.group.role == "hisparse_source"), None)
    device = [p for p in placed if p.group.role != "hisparse_source"]
    if source is not None:
        _check_host_pool(plan, source)
    _check_device_pool(plan, device)
    _check_capacity(plan, source, device)


def _agree(what: str, got: float | None, expected: float | None, formula: str) -> None:
    if isinstance(got, float) and isinstance(expected, float):
        same = math.isclose(got, expected, rel_tol=1e-12)  # floats that went through JSON
    else:
        same = got == expected
    if not same:
        raise PlanInvariantError(f"{what} is {got}; expected {expected} ({formula})")


def _check_host_pool(plan: KVCachePlan, source: PlacedGroup) -> None:
    host = plan.host_pool
    if host is None:
        raise PlanInvariantError("the plan has a hisparse_source group but no host pool")
    page = source.group.spec.page_size_bytes
    _agree("host_pool.bytes_per_block", host.bytes_per_block, page, "the source group's page")
    stride = host_block_stride(page, host.shared)
    _agree("host_pool.block_stride", host.block_stride, stride,
           "source page" + (", rounded up to 4096 for a shared pool" if host.shared else ""))
    _agree("host_pool.num_blocks", host.num_blocks, host.budget_bytes // stride,
           f"budget {host.budget_bytes} // block stride {stride}")
    needed = host_blocks_needed(plan.workload.max_model_len, source.group.spec.block_size)
    if host.num_blocks < needed:
        raise PlanInvariantError(
            f"host_pool.num_blocks is {host.num_blocks}; expected at least {needed} for one "
            f"{plan.workload.max_model_len}-token request, the null block and a copy-on-write tail"
        )


def _check_device_pool(plan: KVCachePlan, device: list[PlacedGroup]) -> None:
    pool = plan.device_pool
    try:
        per_block = device_bytes_per_block(device, pool.layout)
    except PlanError as error:
        raise PlanInvariantError(f"device pool: {error}") from error
    _agree("device_pool.bytes_per_block", pool.bytes_per_block, per_block,
           f"the largest device group block in {pool.layout.value}")
    if pool.num_blocks_override is not None:
        _agree("num_blocks", plan.num_blocks, pool.num_blocks_override, "num_blocks_override")
    else:
        _agree("num_blocks", plan.num_blocks, pool.available_bytes // per_block,
               f"available_bytes {pool.available_bytes} // bytes_per_block {per_block}")


def _check_capacity(
    plan: KVCachePlan, source: PlacedGroup | None, device: list[PlacedGroup]
) -> None:
    if source is None or plan.host_pool is None:
        raise PlanInvariantError(
            "capacity figures are defined for HiSparse plans only so far; expected a "
            "hisparse_source group and a host pool"
        )
    expected = hisparse_capacity(
        device, source, plan.num_blocks, plan.host_pool.num_blocks, plan.workload
    )
    _agree("capacity.max_concurrency", plan.capacity.max_concurrency,
           expected.max_concurrency, "SPEC 5.10")
    _agree("capacity.steady_state_concurrency", plan.capacity.steady_state_concurrency,
           expected.steady_state_concurrency, "SPEC 5.10")
