"""Sizing the pinned host pool that holds the source group (SPEC 5.7)."""

from __future__ import annotations

from hisparse_plan.errors import CapacityError
from hisparse_plan.models import HisparseConfig, HostPool
from hisparse_plan.models.base import GIB
from hisparse_plan.rules.arith import ceil_div, require_int64
from hisparse_plan.targets.trace import Trace
from hisparse_plan.targets.vllm.rules.host import (
    SPARE_HOST_BLOCKS,
    host_block_stride,
    host_blocks_needed,
    host_budget_bytes,
    host_pool_layout,
    longest_request_held,
)


def host_blocks(source_page: int, hisparse: HisparseConfig) -> int:
    """Blocks the host budget holds: budget // block stride."""
    budget = host_budget_bytes(hisparse.host_pool_gib)
    return budget // host_block_stride(source_page, hisparse.shared_host_pool)


def longest_request_for_host(source_page: int, hisparse: HisparseConfig, block_size: int) -> int:
    """The longest request the host pool holds beside the null block and copy-on-write tail."""
    return longest_request_held(host_blocks(source_page, hisparse), block_size)


def plan_host_pool(
    source_page: int,
    hisparse: HisparseConfig,
    max_model_len: int,
    block_size: int,
    trace: Trace,
) -> HostPool:
    budget = host_budget_bytes(hisparse.host_pool_gib)
    stride = host_block_stride(source_page, hisparse.shared_host_pool)
    num_blocks = budget // stride
    needed = host_blocks_needed(max_model_len, block_size)
    if num_blocks < needed:
        least_gib = ceil_div(needed * stride * 1000, GIB) / 1000
        raise CapacityError(
            f"hisparse.host_pool_gib: {hisparse.host_pool_gib} GiB holds {num_blocks} host "
            f"blocks of {stride} bytes; one {max_model_len}-token request needs "
            f"{needed - SPARE_HOST_BLOCKS} + {SPARE_HOST_BLOCKS} (null block and copy-on-write "
            f"tail): expected at least {needed} blocks, so raise host_pool_gib to {least_gib}",
            field="hisparse.host_pool_gib",
        )
    size = require_int64(source_page * num_blocks, "the host pool", field="hisparse.host_pool_gib")
    trace.add("size", "5.7", "host_pool.budget_bytes", budget,
              lambda: f"int(host_pool_gib * 2**30) with host_pool_gib {hisparse.host_pool_gib}")
    trace.add("size", "5.7", "host_pool.block_stride", stride,
              lambda: f"source page {source_page}" + (
                  ", rounded up to 4096 for a shared pool" if hisparse.shared_host_pool else ""))
    trace.add("size", "5.7", "host_pool.bytes_per_block", source_page,
              lambda: "the source group's page: the host tensors stride it per block")
    trace.add("size", "5.7", "host_pool.size", size,
              lambda: f"bytes_per_block {source_page} * num_blocks {num_blocks}")
    trace.add("size", "5.7", "host blocks needed", needed,
              lambda: f"ceil(max_model_len {max_model_len} / block_size {block_size}) + 2 (null "
              "block and copy-on-write tail): the pool must hold at least this many")
    trace.add("size", "5.7", "host_pool.num_blocks", num_blocks,
              lambda: f"budget int({hisparse.host_pool_gib} * 2**30) = {budget} // block stride "
              f"{stride} (source page {source_page}"
              f"{', rounded up to 4096 for a shared pool' if hisparse.shared_host_pool else ''})")
    layout = host_pool_layout(hisparse.host_pool_layout)
    if layout.block_outermost:  # vLLM's own LBNHC needs no line of its own
        trace.add("size", "5.7", "host_pool.layout", layout.value,
                  lambda: "hisparse.host_pool_layout 'block_outermost': a block's source pages "
                  "back to back (see docs/transfer.md#placement-that-transfers-well)")
    return HostPool(
        num_blocks=num_blocks,
        block_stride=stride,
        shared=hisparse.shared_host_pool,
        bytes_per_block=source_page,
        size=size,
        budget_bytes=budget,
        layout=layout,
    )
