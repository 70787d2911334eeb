"""Proof that no two pages share a byte unless the plan allows it (SPEC 5.11).

A layer's pages form *trains*: the same run of bytes repeated once per block, `period` bytes
apart (most pages are one run; a page whose heads axis skips over other layers or blocks is one
run per head). Two runs may share a byte only when they belong to different groups and to the
same block id. The proof works on trains, never on blocks, so its cost does not depend on
num_blocks:

* Trains with one period P form a lattice. Folding a train's start by P gives (q, r): its block
  b lies in window q + b, at r into the window (a run that crosses into the next window is split
  in two, the second part starting window q + 1). Two parts can only meet inside one window, at
  block ids that differ by the difference of their q. So parts with equal q overlap legally
  exactly when their groups differ, and parts whose q differ by less than num_blocks must not
  overlap at all.
* Trains with different periods cannot be compared that way; their byte spans must be disjoint.
"""

from __future__ import annotations

import bisect
import heapq
from dataclasses import dataclass
from itertools import groupby, pairwise

from hisparse_plan.errors import PlanInvariantError
from hisparse_plan.views import LayerView, Train

_WITNESS_SEARCH = 2048
"""Blocks tried from each end when looking for a concrete clash between different periods."""


@dataclass(frozen=True, slots=True)
class _Part:
    """A train folded by its period: in window `q + b` it covers `[r, end)`, as block `b`."""

    q: int
    r: int
    end: int
    train: Train


def check_alignment(view: LayerView) -> None:
    """The view is taken in its dtype, so its offset and strides must be whole elements."""
    found = view.misaligned()
    if found is not None:
        what, value = found
        raise PlanInvariantError(
            f"tensors[{view.tensor}] layer {view.name!r}: {what} {value} is not a multiple "
            f"of the {view.dtype} size {view.itemsize}",
            tensor=view.tensor, layer=view.name,
        )


def prove_disjoint(pool: str, trains: list[Train], num_blocks: int, size: int) -> None:
    """Raise on the first pair of runs that may not share a byte, or a run outside the pool."""
    for train in trains:
        _check_bounds(pool, train, num_blocks, size)
    if num_blocks == 1:
        # One block: every run is block 0, so only runs of one group must stay apart.
        _check_lattice(pool, trains, max(size, 1), num_blocks)
        return
    by_period = sorted(trains, key=lambda train: train.period)
    lattices = [list(group) for _, group in groupby(by_period, key=lambda t: t.period)]
    if len(lattices) > 1:
        _check_lattices_apart(pool, lattices, num_blocks)
    for lattice in lattices:
        _check_lattice(pool, lattice, lattice[0].period, num_blocks)


def _describe(train: Train, block: int) -> str:
    return f"tensors[{train.tensor}] layer {train.layer!r} block {block}"


def _check_bounds(pool: str, train: Train, num_blocks: int, size: int) -> None:
    end = train.start + (num_blocks - 1) * train.period + train.run
    if end > size:
        block = num_blocks - 1 if train.start + train.run <= size else 0
        raise PlanInvariantError(
            f"{_describe(train, block)} ends at byte {end if block else train.start + train.run}"
            f", past the {pool} pool's {size} bytes",
            tensor=train.tensor, layer=train.layer, block=block,
        )
    if num_blocks > 1 and train.run > train.period:
        raise PlanInvariantError(
            f"{_describe(train, 0)} runs {train.run} bytes but blocks are {train.period} bytes "
            "apart, so it overlaps block 1 of the same layer",
            tensor=train.tensor, layer=train.layer, block=0,
        )


def _clash(pool: str, a: Train, block_a: int, b: Train, block_b: int, byte: int) -> None:
    same_group = a.group == b.group
    why = "two layers of one group" if same_group else "different block ids"
    if (a.tensor, a.layer) == (b.tensor, b.layer):
        why = "one layer's page with itself"
    raise PlanInvariantError(
        f"{_describe(a, block_a)} and {_describe(b, block_b)} share byte {byte} of the {pool} "
        f"pool ({why}); expected only different groups to share a block",
        tensor=a.tensor, layer=a.layer, block=block_a,
    )


def _parts(trains: list[Train], period: int) -> list[_Part]:
    parts = []
    for train in trains:
        q, r = divmod(train.start, period)
        if r + train.run <= period:
            parts.append(_Part(q, r, r + train.run, train))
        else:
            # The run crosses into the next window: its tail is block b in window q + 1 + b.
            parts.append(_Part(q, r, period, train))
            parts.append(_Part(q + 1, 0, r + train.run - period, train))
    return parts


def _check_lattice(pool: str, trains: list[Train], period: int, num_blocks: int) -> None:
    parts = _parts(trains, period)
    parts.sort(key=lambda part: (part.q, part.r))
    classes = [list(group) for _, group in groupby(parts, key=lambda part: part.q)]
    for members in classes:
        _check_class(pool, members, period)
    for i, first in enumerate(classes):
        # Classes are sorted by q; only those fewer than num_blocks windows on can meet this
        # one (walked by index: slicing the rest would copy it for every class).
        for j in range(i + 1, len(classes)):
            second = classes[j]
            if second[0].q - first[0].q >= num_blocks:
                break
            _check_classes_apart(pool, first, second, period)


def _check_class(pool: str, members: list[_Part], period: int) -> None:
    """Parts with one q hold the same block id in every window: one group's runs must not meet.

    Sorted by start, a set of runs overlaps somewhere exactly when two neighbours overlap.
    """
    by_group = sorted(members, key=lambda part: (part.train.group, part.r))
    for previous, part in pairwise(by_group):
        if previous.train.group == part.train.group and part.r < previous.end:
            _clash(pool, previous.train, 0, part.train, 0, part.q * period + part.r)


def _check_classes_apart(pool: str, first: list[_Part], second: list[_Part], period: int) -> None:
    """Parts whose q differ by less than num_blocks meet at different block ids: never allowed.

    In window `second.q`, a part of `first` is block `second.q - first.q` and a part of
    `second` is block 0.
    """
    starts = [part.r for part in first]  # `first` is sorted by r
    furthest: list[int] = []
    for part in first:
        furthest.append(max(part.end, furthest[-1]) if furthest else part.end)
    for part in second:
        stop = bisect.bisect_left(starts, part.end)  # parts of `first` starting before it ends
        if stop and furthest[stop - 1] > part.r:
            other = next(o for o in first[:stop] if o.end > part.r)
            byte = part.q * period + max(part.r, other.r)
            _clash(pool, other.train, part.q - other.q, part.train, 0, byte)


def _check_lattices_apart(pool: str, lattices: list[list[Train]], num_blocks: int) -> None:
    """Trains of different periods: every pair whose byte spans overlap is examined."""
    spans = sorted(
        ((train.start, train.start + (num_blocks - 1) * train.period + train.run, train)
         for lattice in lattices for train in lattice),
        key=lambda span: span[:2],
    )
    # Spans that started earlier and may still be open, by period, each a heap by span end:
    # a train is compared only with open spans of other periods.
    active: dict[int, list[tuple[int, int, Train]]] = {}
    for order, (start, end, train) in enumerate(spans):
        for period, heap in active.items():
            while heap and heap[0][0] <= start:
                heapq.heappop(heap)
            if period != train.period:
                for _, _, other in heap:
                    _check_across_periods(pool, other, train, num_blocks)
        heapq.heappush(active.setdefault(train.period, []), (end, order, train))


def _check_across_periods(pool: str, a: Train, b: Train, num_blocks: int) -> None:
    """Runs of a and b meet only where allowed; proved block by block when there are few.

    For each block of `a`, the blocks of `b` that meet it form one range; only the same block
    id of another group may be in it. Beyond `2 * _WITNESS_SEARCH` blocks the middle blocks go
    unexamined, so an unproved pair is refused.
    """
    head = range(min(num_blocks, _WITNESS_SEARCH))
    tail = range(max(num_blocks - _WITNESS_SEARCH, len(head)), num_blocks)
    for block_a in (*head, *tail):
        low = a.start + block_a * a.period
        high = low + a.run
        first = max(0, (low - b.start - b.run) // b.period + 1)
        last = min(num_blocks - 1, (high - 1 - b.start) // b.period)
        for block_b in range(first, min(last, first + 1) + 1):
            if a.group != b.group and block_b == block_a:
                continue
            _clash(pool, a, block_a, b, block_b, max(low, b.start + block_b * b.period))
    if len(head) + len(tail) < num_blocks:
        raise PlanInvariantError(
            f"tensors[{a.tensor}] layer {a.layer!r} (block stride {a.period}) and "
            f"tensors[{b.tensor}] layer {b.layer!r} (block stride {b.period}) cover "
            f"overlapping bytes of the {pool} pool with different block strides, which cannot "
            "be proved apart; expected layers that share bytes to share a block stride",
            tensor=a.tensor, layer=a.layer,
        )
