"""How many max_model_len requests the pools hold (SPEC 5.10)."""

from __future__ import annotations

from hisparse_plan.models import (
    Capacity,
    FullAttentionSpec,
    GroupSpec,
    HisparseResidentSpec,
    MLASpec,
    SlidingWindowSpec,
    UniformTypeSpec,
    Workload,
)
from hisparse_plan.planning.arith import ceil_div
from hisparse_plan.planning.buckets import PlacedGroup

ACTIVE_TAIL_PAGES = 2
"""A request already reading from host pins only its last pages of each resident group."""


def required_blocks(spec: GroupSpec, workload: Workload) -> int:
    """Blocks one max_model_len request needs from a group with this spec."""
    if isinstance(spec, MLASpec | FullAttentionSpec):
        return ceil_div(workload.max_model_len, spec.block_size)
    if isinstance(spec, SlidingWindowSpec):
        # The window may start mid-block, hence one block more (as vLLM sizes it).
        tokens = min(
            spec.sliding_window - 1 + workload.max_num_batched_tokens, workload.max_model_len
        )
        return ceil_div(tokens, spec.block_size) + 1
    if isinstance(spec, UniformTypeSpec):
        return max(required_blocks(member, workload) for member in spec.specs.values())
    if isinstance(spec, HisparseResidentSpec):
        tokens = min(workload.max_in_flight_tokens, workload.max_model_len)
        return ceil_div(tokens, spec.block_size)
    return spec.blocks_per_request


def steady_blocks(spec: GroupSpec, blocks: int) -> int:
    """Of a group's `blocks` per request, those a request keeps once it reads from host."""
    return min(blocks, ACTIVE_TAIL_PAGES) if isinstance(spec, HisparseResidentSpec) else blocks


def hisparse_capacity(
    device_groups: list[PlacedGroup],
    source_group: PlacedGroup,
    num_blocks: int,
    host_blocks: int,
    workload: Workload,
) -> Capacity:
    blocks_of: dict[int, int] = {}  # by spec identity: packs share their specs

    def group_blocks(group: PlacedGroup) -> int:
        needed = 0
        for bucket in group.buckets:
            blocks = blocks_of.get(id(bucket.spec))
            if blocks is None:
                blocks = blocks_of[id(bucket.spec)] = required_blocks(bucket.spec, workload)
            needed = max(needed, blocks)
        return needed

    admission = 0
    steady = 0
    for group in device_groups:
        blocks = group_blocks(group)
        admission += blocks
        steady += steady_blocks(group.group.spec, blocks)
    host_bound = host_blocks / group_blocks(source_group)
    if num_blocks < admission:
        gpu_bound = num_blocks / admission
    else:
        gpu_bound = 1 + (num_blocks - admission) / steady
    return Capacity(
        max_concurrency=min(num_blocks / admission, host_bound),
        steady_state_concurrency=min(gpu_bound, host_bound),
    )
