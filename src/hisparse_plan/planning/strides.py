"""Byte strides of a tensor's logical axes in a physical layout (SPEC 5.9)."""

from __future__ import annotations

from collections.abc import Mapping

from hisparse_plan.models.layout import Axis, KVCacheLayout


def axis_strides(
    layout: KVCacheLayout,
    extents: Mapping[Axis, int],
    fixed: Mapping[Axis, int] | None = None,
) -> dict[Axis, int]:
    """Walk the axes innermost first with a running product; a fixed stride carries outward."""
    pinned = fixed or {}
    strides: dict[Axis, int] = {}
    running = 1
    for axis in reversed(layout.axes):
        stride = pinned.get(axis, running)
        strides[axis] = stride
        running = stride * extents[axis]
    return strides
