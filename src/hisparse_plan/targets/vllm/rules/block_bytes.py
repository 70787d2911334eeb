"""Bytes per device block and which layouts can hold mixed pages (SPEC 5.8, 7.4)."""

from __future__ import annotations

from math import lcm

from hisparse_plan.errors import LayoutError
from hisparse_plan.models import HisparseHotSpec, KVCacheLayout
from hisparse_plan.rules.arith import require_int64, round_up
from hisparse_plan.targets.vllm.rules.buckets import SpecBucket


def layouts_for_mixed_pages(num_groups: int) -> tuple[KVCacheLayout, ...]:
    """Layouts that can place layers of different page sizes in one pool: block-compact, and
    not layer-compact when several groups overlay the pool."""
    return tuple(
        layout
        for layout in KVCacheLayout
        if layout.block_compact and (num_groups == 1 or not layout.layer_compact)
    )


def check_layout(groups: list[list[SpecBucket]], layout: KVCacheLayout, where: str) -> None:
    """Refuse a layout that cannot hold the pages of `groups` (SPEC 5.8, 7.4).

    `groups` counts every group of the pool, also those holding none of its layers.
    """
    pages = {bucket.spec.page_size_bytes for buckets in groups for bucket in buckets}
    allowed = layouts_for_mixed_pages(len(groups))
    if len(pages) > 1 and layout not in allowed:
        names = " and ".join(sorted(option.value for option in allowed))
        shown = sorted(pages)
        listed = ", ".join(map(str, shown[:6])) + (", ..." if len(shown) > 6 else "")
        raise LayoutError(
            f"device.kv_cache_layout: {where} hold pages of {listed} bytes in "
            f"{len(groups)} group(s), which only {names} can pack into one block; got "
            f"{layout.value}",
            field="device.kv_cache_layout",
        )


def bytes_per_block(groups: list[list[SpecBucket]], layout: KVCacheLayout) -> int:
    """One device block: the widest group's pages (SPEC 5.8, 7.4).

    Block-outermost: rounded up to a multiple of every layer's block_stride_alignment and every
    hot page (a hot view strides whole blocks of rows). Otherwise each page is aligned on its
    own, since layers stride their blocks separately.
    """
    if layout.block_outermost:
        raw = max((sum(b.block_bytes for b in buckets) for buckets in groups), default=0)
        multiple = lcm(
            *(bucket.spec.align for buckets in groups for bucket in buckets),
            *(
                bucket.spec.page_size_bytes
                for buckets in groups
                for bucket in buckets
                if isinstance(bucket.spec, HisparseHotSpec)
            ),
        )
        per_block = round_up(raw, multiple)
    else:
        per_block = max(
            (
                sum(round_up(b.spec.page_size_bytes, b.spec.align) * len(b.names) for b in bs)
                for bs in groups
            ),
            default=0,
        )
    return require_int64(per_block, "one device block", field="layers")
