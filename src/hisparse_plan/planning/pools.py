"""Sizing the host pool and the device pool (SPEC 5.7, 5.8)."""

from __future__ import annotations

from math import lcm

from hisparse_plan.errors import CapacityError, LayoutError
from hisparse_plan.models import (
    HisparseConfig,
    HisparseHotSpec,
    HostPool,
    KVCacheLayout,
)
from hisparse_plan.planning.arith import ceil_div, require_int64, round_up
from hisparse_plan.planning.buckets import PlacedGroup

GIB = 2**30
SHARED_POOL_ALIGNMENT = 4096
"""A host pool shared between processes is an mmap: its blocks must start on OS pages."""
SPARE_HOST_BLOCKS = 2
"""The null block and a copy-on-write tail, beyond one max_model_len request."""


def host_budget_bytes(host_pool_gib: float) -> int:
    return int(host_pool_gib * GIB)


def host_block_stride(source_page: int, shared: bool) -> int:
    return round_up(source_page, SHARED_POOL_ALIGNMENT) if shared else source_page


def host_blocks_needed(max_model_len: int, block_size: int) -> int:
    return ceil_div(max_model_len, block_size) + SPARE_HOST_BLOCKS


def plan_host_pool(
    source_page: int, hisparse: HisparseConfig, max_model_len: int, block_size: int
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
    return HostPool(
        num_blocks=num_blocks,
        block_stride=stride,
        shared=hisparse.shared_host_pool,
        bytes_per_block=source_page,
        size=size,
        budget_bytes=budget,
    )


def layouts_for_mixed_pages(num_groups: int) -> tuple[KVCacheLayout, ...]:
    """Layouts that can place layers of different page sizes in one pool."""
    return _MIXED_PAGE_LAYOUTS[num_groups == 1]


_MIXED_PAGE_LAYOUTS = {
    one_group: tuple(
        layout
        for layout in KVCacheLayout
        if layout.block_compact and (one_group or not layout.layer_compact)
    )
    for one_group in (False, True)
}


def device_bytes_per_block(groups: list[PlacedGroup], layout: KVCacheLayout) -> int:
    pages = {bucket.spec.page_size_bytes for group in groups for bucket in group.buckets}
    if len(pages) > 1 and layout not in layouts_for_mixed_pages(len(groups)):
        allowed = layouts_for_mixed_pages(len(groups))
        names = " and ".join(sorted(option.value for option in allowed))
        raise LayoutError(
            f"device.kv_cache_layout: the device groups mix page sizes {sorted(pages)}, which "
            f"only {names} can pack into one block; got {layout.value}",
            field="device.kv_cache_layout",
        )
    per_block = max(group.block_bytes for group in groups)
    if layout.block_outermost:
        hot_pages = {
            group.group.spec.page_size_bytes
            for group in groups
            if isinstance(group.group.spec, HisparseHotSpec)
        }
        if hot_pages:
            # A hot view strides whole blocks of rows, so a block must hold whole hot pages.
            per_block = round_up(per_block, lcm(*hot_pages))
    return require_int64(per_block, "one device block", field="layers")


def device_num_blocks(available_bytes: int, bytes_per_block: int, override: int | None) -> int:
    if override is not None:
        return override
    num_blocks = available_bytes // bytes_per_block
    if num_blocks == 0:
        raise CapacityError(
            f"device.available_bytes: expected at least one device block of {bytes_per_block} "
            f"bytes, got {available_bytes} bytes",
            field="device.available_bytes",
        )
    return num_blocks
