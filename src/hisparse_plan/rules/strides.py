"""Byte strides of a tensor's logical axes `[L, B, H, N, C]` in a physical layout
(SPEC 5.9, 7.5)."""

from __future__ import annotations

from collections.abc import Mapping

from hisparse_plan.errors import LayoutError
from hisparse_plan.models import LayerSpecBase
from hisparse_plan.models.layout import Axis, KVCacheLayout
from hisparse_plan.rules.arith import round_up


def axis_strides(
    layout: KVCacheLayout,
    extents: Mapping[Axis, int],
    fixed: Mapping[Axis, int] | None = None,
    padded_page: int | None = None,
) -> dict[Axis, int]:
    """Walk the axes innermost first with a running product; a fixed stride carries outward.

    With `padded_page`, the running product is raised to at least it when the walk reaches the
    inner of L and B, so consecutive pages are a padded page apart.
    """
    pinned = fixed or {}
    strides: dict[Axis, int] = {}
    running = 1
    axes = layout.axes
    inner = max(axes.index("L"), axes.index("B"))
    for position in range(len(axes) - 1, -1, -1):
        axis = axes[position]
        if position == inner and padded_page is not None:
            running = max(running, padded_page)
        stride = pinned.get(axis, running)
        strides[axis] = stride
        running = stride * extents[axis]
    return strides


def page_extents(spec: LayerSpecBase, layers: int, num_blocks: int) -> dict[Axis, int]:
    """The logical shape `[L, B, H, N, C]` of `layers` layers of `spec` (see
    docs/planning-rules.md#pages)."""
    return {
        "L": layers,
        "B": num_blocks,
        "H": spec.heads,
        "N": spec.tokens_per_block,
        "C": spec.content_bytes,
    }


def fixed_block_stride(
    spec: LayerSpecBase, layout: KVCacheLayout, bytes_per_block: int, name: str
) -> int | None:
    """The B stride a tensor must use (SPEC 7.5): the pool's block in a block-outermost layout,
    the aligned page where alignment pads it, else none (the walk decides)."""
    if layout.block_outermost:
        return bytes_per_block
    page = spec.page_size_bytes
    aligned = round_up(page, spec.align)
    if aligned == page:
        return None
    if not layout.block_compact:
        raise LayoutError(
            f"layers[{name!r}]: block_stride_alignment {spec.align} pads its {page}-byte page "
            f"to {aligned}, which needs a block-compact layout (L and B outermost); got "
            f"{layout.value}",
            field=f"layers[{name!r}].block_stride_alignment",
        )
    return aligned


def layer_and_block_strides(
    spec: LayerSpecBase,
    name: str,
    layers: int,
    num_blocks: int,
    layout: KVCacheLayout,
    bytes_per_block: int,
) -> tuple[int, int]:
    """The L and B strides of `layers` layers of `spec` in a pool of `layout` (SPEC 5.9, 7.5)."""
    extents = page_extents(spec, layers, num_blocks)
    padded = spec.padded_page_bytes
    if padded is not None:
        _check_paddable(spec, name, layout, extents)
    block_stride = fixed_block_stride(spec, layout, bytes_per_block, name)
    fixed: dict[Axis, int] | None = None if block_stride is None else {"B": block_stride}
    strides = axis_strides(layout, extents, fixed, padded)
    return strides["L"], strides["B"]


def _check_paddable(
    spec: LayerSpecBase, name: str, layout: KVCacheLayout, extents: Mapping[Axis, int]
) -> None:
    """A padded page must be one contiguous slab: no H, N or C axis may sit outside it."""
    axes = layout.axes
    inner = max(axes.index("L"), axes.index("B"))
    for axis in axes[:inner]:
        if axis not in ("L", "B") and extents[axis] != 1:
            raise LayoutError(
                f"layers[{name!r}]: {layout.value} puts its {axis} axis (extent "
                f"{extents[axis]}) outside the page, so the page cannot be padded to "
                f"{spec.page_size_bytes} bytes; expected a layout with L and B outermost",
                field="device.kv_cache_layout",
            )
