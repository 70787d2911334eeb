"""The plan's numbers agree with the rules and the workload it records (SPEC 5.7, 5.8, 5.10,
5.12, 7.4, 7.6-7.9), re-derived from the plan alone with the SPEC's rules."""

from __future__ import annotations

import math

from hisparse_plan.errors import PlanError, PlanInvariantError
from hisparse_plan.models import DevicePool, KVCachePlan, Workload
from hisparse_plan.targets.vllm.rules.block_bytes import bytes_per_block, check_layout
from hisparse_plan.targets.vllm.rules.buckets import SpecBucket, spec_buckets, stage_buckets
from hisparse_plan.targets.vllm.rules.capacity import hisparse_capacity, regular_capacity
from hisparse_plan.targets.vllm.rules.host import (
    host_block_stride,
    host_blocks_needed,
    longest_request_held,
)
from hisparse_plan.targets.vllm.rules.pool_memory import pool_blocks, usable_bytes
from hisparse_plan.targets.vllm.rules.required import buckets_required, longest_fitting


def check_sizing(plan: KVCachePlan) -> None:
    groups = [spec_buckets(g.spec, g.layer_names) for g in plan.groups]
    is_source = [g.role == "hisparse_source" for g in plan.groups]
    source = next((b for b, s in zip(groups, is_source, strict=True) if s), None)
    device = [b for b, s in zip(groups, is_source, strict=True) if not s]
    if source is not None:
        _check_host_pool(plan, source)
    _check_device_pools(plan, device)
    _check_admission(plan, device)
    _check_capacity(plan, source, device, [g.spec for g, s in zip(
        plan.groups, is_source, strict=True) if not s])


def _agree(what: str, got: float | None, expected: float | None, formula: str) -> None:
    if isinstance(got, float) and isinstance(expected, float):
        same = math.isclose(got, expected, rel_tol=1e-12)  # floats that went through JSON
    else:
        same = got == expected
    if not same:
        raise PlanInvariantError(f"{what} is {got}; expected {expected} ({formula})")


def _check_host_pool(plan: KVCachePlan, source: list[SpecBucket]) -> None:
    host = plan.host_pool
    if host is None:
        raise PlanInvariantError("the plan has a hisparse_source group but no host pool")
    page = sum(bucket.block_bytes for bucket in source)
    _agree("host_pool.bytes_per_block", host.bytes_per_block, page, "the source group's page")
    stride = host_block_stride(page, host.shared)
    _agree("host_pool.block_stride", host.block_stride, stride,
           "source page" + (", rounded up to 4096 for a shared pool" if host.shared else ""))
    _agree("host_pool.num_blocks", host.num_blocks, host.budget_bytes // stride,
           f"budget {host.budget_bytes} // block stride {stride}")
    needed = host_blocks_needed(plan.max_model_len, source[0].spec.block_size)
    if host.num_blocks < needed:
        raise PlanInvariantError(
            f"host_pool.num_blocks is {host.num_blocks}; expected at least {needed} for one "
            f"{plan.max_model_len}-token request, the null block and a copy-on-write tail"
        )


def stage_groups(plan: KVCachePlan) -> list[list[list[SpecBucket]]]:
    """Every device group's buckets projected onto each stage's layers (SPEC 7.6): a group
    keeps the stage's layers, a uniform_type group its members in their own order; a group
    with none of the stage's layers has no bucket there."""
    device = [g for g in plan.groups if g.role != "hisparse_source"]
    projected = []
    for pool in plan.device_pools:
        if pool.layers is None:
            projected.append([spec_buckets(g.spec, g.layer_names) for g in device])
            continue
        names = set(pool.layers)
        projected.append([stage_buckets(g.spec, g.layer_names, names) for g in device])
    return projected


def _check_one_override(plan: KVCachePlan) -> None:
    """Every stage states the one num_blocks override the request asked for (or none): the
    blocks are counted once for all stages, so a stage's own override would be a figure no
    pool follows."""
    first = plan.device_pools[0].num_blocks_override
    for index, pool in enumerate(plan.device_pools):
        if pool.num_blocks_override != first:
            raise PlanInvariantError(
                f"device_pools[{index}].num_blocks_override is {pool.num_blocks_override}; "
                f"expected {first}, device_pools[0]'s: every stage takes the request's one "
                "override"
            )


def _check_device_pools(plan: KVCachePlan, device: list[list[SpecBucket]]) -> None:
    """Each stage's bytes per block, and the num_blocks they give."""
    _check_one_override(plan)
    fitting = []
    for index, (pool, groups) in enumerate(zip(
            plan.device_pools, stage_groups(plan), strict=True)):
        what = f"device_pools[{index}]"
        try:
            check_layout(groups, pool.layout, what)
            per_block = bytes_per_block(groups, pool.layout)
        except PlanError as error:
            raise PlanInvariantError(f"{what}: {error}") from error
        _agree(f"{what}.bytes_per_block", pool.bytes_per_block, per_block,
               f"the widest group block in {pool.layout.value}, aligned")
        fitting.append(pool_blocks(pool.available_bytes, per_block, pool.num_blocks_override))
    _agree("num_blocks", plan.num_blocks, min(fitting),
           "the override, or the least over stages of available_bytes // bytes_per_block")


def _usable(pool: DevicePool) -> int:
    return usable_bytes(pool.available_bytes, pool.bytes_per_block, pool.num_blocks_override)


def _check_admission(plan: KVCachePlan, device: list[list[SpecBucket]]) -> None:
    """One max_model_len request fits every stage beside the null block (SPEC 5.12, 7.7), and
    an auto-fitted length is the longest that does (7.8)."""
    workload = plan.workload

    def blocks(length: int) -> int:
        return sum(buckets_required(b, length, workload) for b in device if b)

    length = plan.max_model_len
    for index, pool in enumerate(plan.device_pools):
        usable = _usable(pool)
        needed = pool.bytes_per_block * blocks(length)
        if usable <= 0 or needed > usable:
            raise PlanInvariantError(
                f"device_pools[{index}] leaves {usable} usable bytes; one {length}-token request "
                f"needs {needed} (see docs/planning-rules.md#admission): the plan admits a "
                "request that cannot fit"
            )
    if plan.fitted_max_model_len is not None:
        longest = min(
            longest_fitting(pool.bytes_per_block, _usable(pool), blocks, workload.max_model_len)
            for pool in plan.device_pools
        )
        source = [g for g in plan.groups if g.role == "hisparse_source"]
        if plan.host_pool is not None and source:
            held = longest_request_held(plan.host_pool.num_blocks, source[0].spec.block_size)
            longest = min(longest, held)
        _agree("fitted_max_model_len", plan.fitted_max_model_len, longest,
               f"the longest length <= {workload.max_model_len} that fits every stage (and the "
               "host pool)")


def _check_capacity(
    plan: KVCachePlan,
    source: list[SpecBucket] | None,
    device: list[list[SpecBucket]],
    device_specs: list[object],
) -> None:
    workload: Workload = plan.workload
    length = plan.max_model_len
    required = [buckets_required(b, length, workload) for b in device]
    if source is None:
        expected = regular_capacity(plan.num_blocks, required)
        formula = "docs/planning-rules.md#capacity"
    else:
        if plan.host_pool is None:
            raise PlanInvariantError("the plan has a hisparse_source group but no host pool")
        expected = hisparse_capacity(
            plan.num_blocks, device_specs, required,  # type: ignore[arg-type]
            plan.host_pool.num_blocks, buckets_required(source, length, workload),
        )
        formula = "docs/planning-rules.md#capacity"
    _agree("capacity.max_concurrency", plan.capacity.max_concurrency,
           expected.max_concurrency, formula)
    _agree("capacity.steady_state_concurrency", plan.capacity.steady_state_concurrency,
           expected.steady_state_concurrency, formula)
