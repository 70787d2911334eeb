"""Engine views (`BufferView`) proved from the plan alone, in closed form
(docs/plan-contract.md#views).

A tensor's views are its engine's own tensors over its pages, view i over page range i. The page
proof (`prove_disjoint`) already shows every page inside its allocation and apart from every
other page; so a view is sound when every element it reaches is in its own page, or in bytes no
page owns and no other view reaches:

* Its axes are [layers,] rows, inner axes: a whole pool's views are layer-first (the layer axis
  strides the tensor's layer stride), a per-layer pool's have no layer axis (each layer has its
  own allocation).
* Row j belongs to block j // A, where A is 1 (page-major: a row a block, its stride the block
  stride) or the block's tokens (token-major: its stride a token's share of the block stride).
  The A rows of one page and the inner span of the last one end inside the page range, so each
  of the first num_blocks * A rows lies in its own block's page of range i.
* No axis aliases another: sorted by stride, each stride is at least the span of the axes below
  it (the classic non-overlap test; a size-1 axis takes no bytes of its own), so no two elements
  of the view share a byte.
* Rows past the last block (spare rows SGLang keeps: DeepSeek-V4's compressor states, a pool
  rounded up to rows rather than pages, the K half of a window pool capped at an unaligned
  token count) lie in the allocation's unowned tail: from the first spare row's byte to the
  view's end, in bytes no page of the allocation owns (past every page, or between two),
  inside it, and apart from every other view's tail.

Every address is a whole number of elements from the allocation's start, so starts and strides
are dtype-aligned by construction once they agree with the pages in bytes. Nothing here lists
blocks, rows or elements: the cost grows with tensors, views and layers alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import prod

from hisparse_plan.errors import PlanInvariantError
from hisparse_plan.models.base import INT64_MAX
from hisparse_plan.models.plan import KVCacheTensor
from hisparse_plan.models.pools import BUFFER_DTYPE_SIZE, BufferView, PageRange, Pool

AllocationOwner = tuple[str, str | None]
"""(pool name, layer): one layer's allocation of a per-layer pool, or a whole pool's one."""


@dataclass(frozen=True, slots=True)
class Tail:
    """Bytes [start, end) of an allocation that a view's spare rows may reach."""

    start: int
    end: int
    tensor: int
    view: str


def check_views(pools: dict[str, Pool], tensors: Sequence[KVCacheTensor]) -> None:
    """Every view of every tensor inside its own pages or the unowned tail of its allocation,
    apart from every other view, its names unique on the allocation (module doc)."""
    tails: dict[int, list[Tail]] = {}
    for index, tensor in enumerate(tensors):
        if not tensor.views:
            continue
        pool = pools[tensor.pool]
        ranges = tensor.ranges
        if ranges is None or len(tensor.views) != len(ranges):
            count = 0 if ranges is None else len(ranges)
            raise PlanInvariantError(
                f"tensors[{index}] has {len(tensor.views)} views for {count} page ranges; "
                "expected one view per range", tensor=index, layer=tensor.layers[0],
            )
        tails[index] = [
            tail for view, part in zip(tensor.views, ranges, strict=True)
            if (tail := check_view(index, tensor, view, part, pool)) is not None
        ]
    for members, owner in _allocations(pools, tensors).items():
        _check_allocation(owner, members, tensors, tails, pools[owner[0]])


def check_view(
    index: int, tensor: KVCacheTensor, view: BufferView, part: PageRange, pool: Pool
) -> Tail | None:
    """One view over range `part` of the tensor's pages: its first num_blocks * A rows inside
    their own pages, no axis aliasing another, inside the allocation; the bytes its spare rows
    may reach (None without spare rows)."""
    def refuse(what: str) -> PlanInvariantError:
        return PlanInvariantError(f"tensors[{index}] view {view.name!r} {what}",
                                  tensor=index, layer=tensor.layers[0])

    if len(view.shape) != len(view.strides):
        raise refuse(f"has {len(view.shape)} dims but {len(view.strides)} strides; expected one "
                     "stride per dim")
    end = view.end_byte
    if end > pool.size or end > INT64_MAX:
        raise refuse(f"ends at byte {end}, past its pool {pool.name!r}'s {pool.size} bytes; "
                     "expected it inside the allocation")
    itemsize = BUFFER_DTYPE_SIZE[view.dtype]
    axes = list(zip(view.shape, view.strides, strict=True))
    if pool.allocation == "whole":
        layers, step = axes.pop(0)
        got, want = (layers, step * itemsize), (len(tensor.layers), tensor.layer_stride)
        if got != want:
            raise refuse(f"has a layer axis of (layers, bytes a layer) {got}; the pages it "
                         f"views give {want}")
    if not axes:
        raise refuse("has no row axis; expected one (after the layer axis of a whole pool)")
    rows, row_step = axes[0]
    inner = axes[1:]
    step = row_step * itemsize
    per_page = rows_a_page(step, tensor.block_stride, pool.block_tokens or 1)
    if per_page is None:
        raise refuse(f"steps {step} bytes a row; the pages it views give {tensor.block_stride} "
                     f"a block of {pool.block_tokens or 1} tokens (a row a block, or a row a "
                     "token)")
    owned = pool.num_blocks * per_page
    if rows < owned:
        raise refuse(f"has {rows} rows; the pool's {pool.num_blocks} blocks need {owned}")
    row_bytes = prod(extent for extent, _ in inner) * itemsize
    if row_bytes * per_page != part.size:
        raise refuse(f"holds {row_bytes * per_page} bytes a page; the pages it views give "
                     f"{part.size}")
    start = view.storage_offset * itemsize
    if start != tensor.offset + part.offset:
        raise refuse(f"starts at byte {start}; the pages it views give "
                     f"{tensor.offset + part.offset}")
    clash = aliased_axis(view.shape, view.strides)
    if clash is not None:
        raise refuse(f"strides axis {clash} by {view.strides[clash]} elements, inside the span "
                     "of the axes of smaller strides; expected no two elements of the view to "
                     "share a byte")
    span = inner_span(inner) * itemsize
    reach = (per_page - 1) * step + span
    if reach > part.size:
        raise refuse(f"reaches {reach} bytes from a page's start with its {per_page} rows of a "
                     f"page; expected them inside its {part.size}-byte range")
    if rows == owned:
        return None
    return Tail(start + owned * step, end, index, view.name)


def rows_a_page(step: int, block_stride: int, tokens: int) -> int | None:
    """Rows of one page for a view stepping `step` bytes a row: 1 when a row is a block, the
    block's tokens when a row is a token; None when it is neither."""
    if step == block_stride:
        return 1
    if step * tokens == block_stride:
        return tokens
    return None


def inner_span(axes: Sequence[tuple[int, int]]) -> int:
    """Elements from the first to one past the last element of one row (1 for no axis)."""
    return sum((extent - 1) * stride for extent, stride in axes) + 1


def aliased_axis(shape: Sequence[int], strides: Sequence[int]) -> int | None:
    """The first axis (by stride) whose stride is below the span of the axes with smaller
    strides, so that two elements share a byte; None when there is none. Axes of one entry
    take no bytes of their own; a view of no element aliases nothing."""
    if 0 in shape:
        return None
    span = 1
    for stride, extent, axis in sorted(
        (stride, extent, axis)
        for axis, (extent, stride) in enumerate(zip(shape, strides, strict=True))
        if extent > 1
    ):
        if stride < span:
            return axis
        span += (extent - 1) * stride
    return None


def _allocations(
    pools: dict[str, Pool], tensors: Sequence[KVCacheTensor]
) -> dict[tuple[int, ...], AllocationOwner]:
    """Each distinct set of tensors that share an allocation (in plan order), and the first
    allocation they share: a per-layer pool's layers that hold the same tensors are proved
    once."""
    found: dict[AllocationOwner, list[int]] = {}
    for index, tensor in enumerate(tensors):
        if tensor.ranges is None:
            continue  # pages without explicit ranges carry no views
        if pools[tensor.pool].allocation == "whole":
            found.setdefault((tensor.pool, None), []).append(index)
            continue
        for layer in tensor.layers:
            found.setdefault((tensor.pool, layer), []).append(index)
    distinct: dict[tuple[int, ...], AllocationOwner] = {}
    for owner, members in found.items():
        distinct.setdefault(tuple(members), owner)
    return distinct


def page_end(tensor: KVCacheTensor, pool: Pool) -> int:
    """One past the last byte of the tensor's pages in its allocation (its last layer's last
    block's last range; every stride is non-negative)."""
    ranges = tensor.ranges or []
    last = max((part.offset + part.size for part in ranges), default=0)
    layers = len(tensor.layers) if pool.allocation == "whole" else 1
    return (tensor.offset + (layers - 1) * tensor.layer_stride
            + (pool.num_blocks - 1) * tensor.block_stride + last)


def page_met(tail: Tail, tensors: Sequence[KVCacheTensor], pool: Pool) -> int | None:
    """The first byte of a page of `tensors` (every layer of a whole pool, every range, every
    block) that meets [tail.start, tail.end); None when none does. Blocks step up by the block
    stride, so of one (layer, range) train only the first page that ends past the tail's start
    can begin before its end: one division a train, no list of blocks."""
    for tensor in tensors:
        layers = len(tensor.layers) if pool.allocation == "whole" else 1
        for layer in range(layers):
            for part in tensor.ranges or []:
                base = tensor.offset + layer * tensor.layer_stride + part.offset
                step = tensor.block_stride
                if step > 0:
                    block = max(0, (tail.start - base - part.size) // step + 1)
                else:
                    block = 0 if base + part.size > tail.start else pool.num_blocks
                begin = base + block * step
                if block < pool.num_blocks and begin < tail.end and part.size > 0:
                    return begin
    return None


def _check_allocation(
    owner: AllocationOwner, members: tuple[int, ...], tensors: Sequence[KVCacheTensor],
    tails: dict[int, list[Tail]], pool: Pool,
) -> None:
    """View names unique on the allocation; spare rows past every page and apart."""
    where = (f"pool {owner[0]!r}" if owner[1] is None
             else f"pool {owner[0]!r} (layer {owner[1]!r})")
    named: set[str] = set()
    for index in members:
        for view in tensors[index].views:
            if view.name in named:
                raise PlanInvariantError(
                    f"tensors[{index}] has a view named {view.name!r} like another view on "
                    f"{where}; expected unique view names on an allocation",
                    tensor=index, layer=tensors[index].layers[0],
                )
            named.add(view.name)
    spare = sorted((tail for index in members for tail in tails.get(index, [])),
                   key=lambda tail: tail.start)
    if not spare:
        return
    # Every tensor on the allocation, with views or without: no tail may reach a page.
    pages = max(page_end(tensors[index], pool) for index in members)
    for tail in spare:
        if tail.start >= pages:
            break  # sorted by start: this tail and the rest lie past every page
        met = page_met(tail, [tensors[index] for index in members], pool)
        if met is not None:
            raise PlanInvariantError(
                f"tensors[{tail.tensor}] view {tail.view!r}: its rows past the pool's last "
                f"block reach bytes [{tail.start}, {tail.end}) of {where}, which meet the page "
                f"at byte {met}; expected spare rows in bytes no page of the allocation owns",
                tensor=tail.tensor, layer=tensors[tail.tensor].layers[0],
            )
    first = spare[0]
    furthest = first
    for tail in spare[1:]:
        # Sorted by start, a tail meets an earlier one exactly when it starts before the
        # furthest end reached so far.
        if tail.start < furthest.end:
            raise PlanInvariantError(
                f"tensors[{tail.tensor}] view {tail.view!r}: its rows past the pool's last "
                f"block reach bytes [{tail.start}, {tail.end}) of {where}, which meet those of "
                f"tensors[{furthest.tensor}] view {furthest.view!r} (to byte {furthest.end}); "
                "expected every view's spare rows apart",
                tensor=tail.tensor, layer=tensors[tail.tensor].layers[0],
            )
        furthest = max(furthest, tail, key=lambda reach: reach.end)
