"""Lower logical moves to byte rows through each side's places (see docs/transfer.md#rows).

A move is (layer, source rank, destination rank, global heads, a group of unit runs, a
segment of the logical row); each side places it with its own strides, so layouts, block
sizes and tensor-parallel splits are all handled here, as strided copies. Every row keeps
what it moves in logical terms (where its first chunk starts, the box one chunk covers, the
step from one chunk to the next), so that coalescing never joins bytes that do not follow
one another logically."""

from __future__ import annotations

from itertools import product
from typing import NamedTuple

from hisparse_plan.exchange.transfer.facts.rank_facts import FieldPlace
from hisparse_plan.exchange.transfer.program.units import UnitGroup

Vector = tuple[int, int, int, int]
"""(layer ordinal, unit, global head, row byte)."""


class Row(NamedTuple):
    """A TransferRow before it is a model, with its logical bookkeeping: where its first
    chunk starts, the step from one chunk to the next, the box one chunk covers."""

    src_rank: int
    src_region: str
    src_offset: int
    length: int
    chunks: int
    src_stride: int
    dst_rank: int
    dst_region: str
    dst_offset: int
    dst_stride: int
    layer: str
    start: Vector
    step: Vector
    extent: Vector
    last: int
    """The layer ordinal of the last layer one chunk runs through."""

Axis = tuple[int, int, int, Vector]
"""(extent, source stride, destination stride, logical step)."""
ZERO: Vector = (0, 0, 0, 0)


def add(a: Vector, b: Vector, times: int = 1) -> Vector:
    return (a[0] + times * b[0], a[1] + times * b[1], a[2] + times * b[2], a[3] + times * b[3])


def tiles(step: Vector, extent: Vector) -> int | None:
    """The one dimension `step` moves along, by exactly the box's extent there (the steps
    then tile the box into a longer one); else None."""
    moving = [index for index, value in enumerate(step) if value]
    if len(moving) == 1 and step[moving[0]] == extent[moving[0]]:
        return moving[0]
    return None


def grown(extent: Vector, dimension: int, times: int) -> Vector:
    values = list(extent)
    values[dimension] *= times
    return (values[0], values[1], values[2], values[3])


def flatten(chunk: int, extent: Vector, axes: list[Axis]) -> tuple[int, Vector, list[Axis]]:
    """The fewest axes for the same copy: axes of extent 1 go; an axis whose strides are the
    chunk on both sides, and whose step tiles the chunk's box, joins the chunk; two axes where
    the outer steps over the whole inner, on both sides and logically, become one."""
    axes = [axis for axis in axes if axis[0] > 1]
    changed = True
    while changed:
        changed = False
        for axis in axes:
            dimension = tiles(axis[3], extent)
            if axis[1] == chunk and axis[2] == chunk and dimension is not None:
                chunk *= axis[0]
                extent = grown(extent, dimension, axis[0])
                axes.remove(axis)
                changed = True
                break
        for outer, inner in product(axes, axes):
            if outer is not inner and outer[1] == inner[0] * inner[1] \
                    and outer[2] == inner[0] * inner[2] \
                    and outer[3] == add(ZERO, inner[3], inner[0]):
                axes.remove(outer)
                axes.remove(inner)
                axes.append((outer[0] * inner[0], inner[1], inner[2], inner[3]))
                changed = True
                break
    return chunk, extent, axes


def strided_rows(
    ranks: tuple[int, int], regions: tuple[str, str], starts: tuple[int, int], chunk: int,
    logical: tuple[Vector, Vector], axes: list[Axis], layer: str,
) -> list[Row]:
    """A strided copy as rows: its widest axis whose step tiles the chunk is each row's count,
    every other axis one row per index."""
    start, extent = logical
    chunk, extent, axes = flatten(chunk, extent, axes)
    if not axes:
        return [Row(ranks[0], regions[0], starts[0], chunk, 1, 0, ranks[1], regions[1],
                    starts[1], 0, layer, start, ZERO, extent, start[0])]
    tiling = [axis for axis in axes if tiles(axis[3], extent) is not None] or axes
    counted = max(tiling, key=lambda axis: axis[0])
    others = [axis for axis in axes if axis is not counted]
    rows: list[Row] = []
    for index in product(*(range(axis[0]) for axis in others)):
        src, dst, at = starts[0], starts[1], start
        for i, axis in zip(index, others, strict=True):
            src, dst, at = src + i * axis[1], dst + i * axis[2], add(at, axis[3], i)
        rows.append(Row(ranks[0], regions[0], src, chunk, counted[0], counted[1], ranks[1],
                        regions[1], dst, counted[2], layer, at, counted[3], extent, at[0]))
    return rows


def place_offset(place: FieldPlace, run_lo: int, lo: int, block: int, n: int, head: int
                 ) -> int:
    """The byte of logical row byte `lo` of (block, unit n, local head) on one side."""
    return (place.base + (lo - run_lo) + block * place.block_stride + n * place.unit_stride
            + head * place.head_stride)


def lower_move(
    layer: tuple[str, int],
    ranks: tuple[int, int],
    heads: tuple[int, int],
    head_starts: tuple[int, int],
    segment: tuple[int, int, FieldPlace, int, FieldPlace, int],
    group: UnitGroup,
) -> list[Row]:
    """One move's rows: global heads [heads), one segment of the row, one group of units;
    `layer` is (name, ordinal)."""
    lo, hi, src, src_lo, dst, dst_lo = segment
    src_head, dst_head = heads[0] - head_starts[0], heads[0] - head_starts[1]
    starts = (
        place_offset(src, src_lo, lo, group.src_block, group.src_n, src_head),
        place_offset(dst, dst_lo, lo, group.dst_block, group.dst_n, dst_head),
    )
    axes: list[Axis] = [
        (group.length, src.unit_stride, dst.unit_stride, (0, 1, 0, 0)),
        (group.count,
         group.src_block_step * src.block_stride + group.src_n_step * src.unit_stride,
         group.dst_block_step * dst.block_stride + group.dst_n_step * dst.unit_stride,
         (0, group.unit_step or group.length, 0, 0)),
        (heads[1] - heads[0], src.head_stride, dst.head_stride, (0, 0, 1, 0)),
    ]
    logical = ((layer[1], group.unit, heads[0], lo), (1, 1, 1, hi - lo))
    return strided_rows(ranks, (src.region, dst.region), starts, hi - lo, logical, axes,
                        layer[0])
