"""What a plan buys: concurrent max_model_len requests (SPEC 5.10, 7.9)."""

from __future__ import annotations

from hisparse_plan.models import Capacity, GroupSpec
from hisparse_plan.targets.vllm.rules.required import steady_blocks


def regular_capacity(num_blocks: int, required: list[int]) -> Capacity:
    """7.9: num_blocks over the blocks one request holds in every group."""
    return Capacity(max_concurrency=num_blocks / sum(required), steady_state_concurrency=None)


def hisparse_capacity(
    num_blocks: int,
    device_specs: list[GroupSpec],
    required: list[int],
    host_blocks: int,
    host_required: int,
) -> Capacity:
    """5.10: the device and host bounds. In steady state a request that reads from host keeps
    only the tail of each resident group, but admitting one still takes its whole window."""
    admission = sum(required)
    steady = sum(
        steady_blocks(spec, blocks) for spec, blocks in zip(device_specs, required, strict=True)
    )
    host_bound = host_blocks / host_required
    if num_blocks < admission:
        gpu_bound = num_blocks / admission
    else:
        gpu_bound = 1 + (num_blocks - admission) / steady
    return Capacity(
        max_concurrency=min(num_blocks / admission, host_bound),
        steady_state_concurrency=min(gpu_bound, host_bound),
    )
