"""Proof that no two pages share a byte unless the plan allows it (SPEC 5.11).

A layer's pages form *trains*: the same run of bytes repeated once per block, `period` bytes
apart (most pages are one run; a page whose heads axis skips over other layers or blocks is one
run per head). Two runs may share a byte only when they belong to different groups and to the
same block id. The proof works on trains, never on blocks, so its cost does not depend on
num_blocks:

* Trains with one period P form a lattice. Folding a train's start by P gives (q, r): its run
  k lies in window q + k, at r into the window (a run that crosses into the next window is split
  in two, the second part starting window q + 1). Run k holds block k % num_blocks: a train has
  num_blocks runs, or a whole number of times that when a page's heads are one block train
  apart (see `trains`). Two parts can only meet inside one window, where their block ids differ
  by the difference of their q (mod num_blocks). So parts whose q agree mod num_blocks overlap
  legally exactly when their groups differ, and any other parts whose windows meet must not
  overlap at all.
* Trains with different periods cannot be compared that way; their byte spans must be disjoint.

Nothing here lists heads or blocks, so the cost depends on the number of trains alone.
"""

from __future__ import annotations

import bisect
import heapq
from dataclasses import dataclass, replace
from itertools import groupby, pairwise

from hisparse_plan.checking.trains import layer_at
from hisparse_plan.errors import PlanInvariantError
from hisparse_plan.views import LayerView, Train

_WITNESS_SEARCH = 2048
"""Blocks tried from each end when looking for a concrete clash between different periods."""


@dataclass(frozen=True, slots=True)
class _Part:
    """A train folded by its period: in window `q + k` it covers `[r, end)`, as run `k`
    (block `k % num_blocks`), for `k < train.count`."""

    q: int
    r: int
    end: int
    train: Train

    @property
    def span(self) -> int:
        """Windows the part reaches, from `q` on."""
        return self.train.count


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


def check_page_inside(view: LayerView, pool: str, size: int) -> None:
    """A layer's last page ends inside its pool, padding included: a page is page_size_bytes
    from its first byte (docs/planning-rules.md#pages), which engines copy whole. The runs of
    an unpadded page reach as far (`prove_disjoint`); a padded page's padding may reach
    further."""
    end = view.offset + (view.num_blocks - 1) * view.block_stride + view.page_size_bytes
    if view.num_blocks and end > size:
        raise PlanInvariantError(
            f"tensors[{view.tensor}] layer {view.name!r} block {view.num_blocks - 1}: its "
            f"{view.page_size_bytes}-byte page ends at byte {end}, past the {pool} pool's "
            f"{size} bytes; expected every page inside its pool, padding included",
            tensor=view.tensor, layer=view.name, block=view.num_blocks - 1,
        )


def prove_disjoint(pool: str, trains: list[Train], num_blocks: int, size: int) -> None:
    """Raise on the first pair of runs that may not share a byte, or a run outside the pool."""
    for train in trains:
        _check_bounds(pool, train, num_blocks, size)
    trains = [train for train in trains if train.run > 0]  # an empty page holds no byte
    if num_blocks == 1:
        # One block: every run is block 0. Single runs are folded by the pool's size (one
        # window holds them all); a page's runs one block stride apart keep that period.
        window = max(size, 1)
        trains = [train if train.count > 1 else replace(train, period=window)
                  for train in trains]
    by_period = sorted(trains, key=lambda train: train.period)
    lattices = [list(group) for _, group in groupby(by_period, key=lambda t: t.period)]
    if len(lattices) > 1:
        _check_lattices_apart(pool, lattices, num_blocks)
    for lattice in lattices:
        _check_lattice(pool, lattice, lattice[0].period, num_blocks)


def _describe(train: Train, run: int, num_blocks: int, byte: int | None = None) -> str:
    """Name run `run` of a train: its tensor, layer, block and (for a page whose heads are one
    block train apart) head."""
    layer = train.layer if byte is None else layer_at(train, byte)
    head = f" head {run // num_blocks}" if train.count > num_blocks else ""
    return f"tensors[{train.tensor}] layer {layer!r} block {run % num_blocks}{head}"


def _check_bounds(pool: str, train: Train, num_blocks: int, size: int) -> None:
    end = train.start + (train.count - 1) * train.period + train.run
    if end > size:
        run = train.count - 1 if train.start + train.run <= size else 0
        raise PlanInvariantError(
            f"{_describe(train, run, num_blocks)} ends at byte "
            f"{end if run else train.start + train.run}, past the {pool} pool's {size} bytes",
            tensor=train.tensor, layer=train.layer, block=run % num_blocks,
        )
    if train.count > 1 and train.run > train.period:
        next_run = "block 1" if num_blocks > 1 else "head 1"
        raise PlanInvariantError(
            f"{_describe(train, 0, num_blocks)} runs {train.run} bytes but its runs are "
            f"{train.period} bytes apart, so it overlaps {next_run} of the same layer",
            tensor=train.tensor, layer=train.layer, block=0,
        )


def _clash(
    pool: str, a: Train, run_a: int, b: Train, run_b: int, byte: int, num_blocks: int
) -> None:
    layer_a, layer_b = layer_at(a, byte), layer_at(b, byte)
    same_group = a.group == b.group
    why = "two layers of one group" if same_group else "different block ids"
    if (a.tensor, layer_a) == (b.tensor, layer_b):
        why = "one layer's page with itself"
    raise PlanInvariantError(
        f"{_describe(a, run_a, num_blocks, byte)} and {_describe(b, run_b, num_blocks, byte)} "
        f"share byte {byte} of the {pool} pool ({why}); expected only different groups to "
        "share a block",
        tensor=a.tensor, layer=layer_a, block=run_a % num_blocks,
    )


def _parts(trains: list[Train], period: int) -> list[_Part]:
    parts = []
    for train in trains:
        q, r = divmod(train.start, period)
        if r + train.run <= period:
            parts.append(_Part(q, r, r + train.run, train))
        else:
            # The run crosses into the next window: its tail is run k in window q + 1 + k.
            parts.append(_Part(q, r, period, train))
            parts.append(_Part(q + 1, 0, r + train.run - period, train))
    return parts


def _check_lattice(pool: str, trains: list[Train], period: int, num_blocks: int) -> None:
    parts = _parts(trains, period)
    parts.sort(key=lambda part: (part.q, part.r))
    classes = [list(group) for _, group in groupby(parts, key=lambda part: part.q)]
    for members in classes:
        _check_same_block(pool, members, period, num_blocks)
    for i, first in enumerate(classes):
        # Classes are sorted by q; only those that start within the reach of one of this
        # class's parts can meet it (walked by index: slicing the rest would copy it for every
        # class).
        reach = max(part.span for part in first)
        for j in range(i + 1, len(classes)):
            second = classes[j]
            distance = second[0].q - first[0].q
            if distance >= reach:
                break
            reaching = [part for part in first if part.span > distance]
            if distance % num_blocks:
                _check_classes_apart(pool, reaching, second, period, num_blocks)
            else:
                _check_same_block(pool, reaching + second, period, num_blocks)


def _check_same_block(
    pool: str, members: list[_Part], period: int, num_blocks: int
) -> None:
    """Parts that hold the same block id wherever they meet (their q agree mod num_blocks):
    one group's runs must not meet.

    Sorted by start, a set of runs overlaps somewhere exactly when two neighbours overlap.
    """
    by_group = sorted(members, key=lambda part: (part.train.group, part.r))
    for previous, part in pairwise(by_group):
        if previous.train.group == part.train.group and part.r < previous.end:
            later = max(previous.q, part.q)
            _clash(pool, previous.train, later - previous.q, part.train, later - part.q,
                   later * period + part.r, num_blocks)


def _check_classes_apart(
    pool: str, first: list[_Part], second: list[_Part], period: int, num_blocks: int
) -> None:
    """Parts whose windows meet at different block ids: never allowed to overlap.

    In window `second.q`, a part of `first` is run `second.q - first.q` and a part of
    `second` is run 0.
    """
    if not first:
        return
    starts = [part.r for part in first]  # `first` is sorted by r
    furthest: list[int] = []
    for part in first:
        furthest.append(max(part.end, furthest[-1]) if furthest else part.end)
    for part in second:
        stop = bisect.bisect_left(starts, part.end)  # parts of `first` starting before it ends
        if stop and furthest[stop - 1] > part.r:
            other = next(o for o in first[:stop] if o.end > part.r)
            byte = part.q * period + max(part.r, other.r)
            _clash(pool, other.train, part.q - other.q, part.train, 0, byte, num_blocks)


def _check_lattices_apart(pool: str, lattices: list[list[Train]], num_blocks: int) -> None:
    """Trains of different periods: every pair whose byte spans overlap is examined."""
    spans = sorted(
        ((train.start, train.start + (train.count - 1) * train.period + train.run, train)
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
    """Runs of a and b meet only where allowed; proved run by run when there are few.

    For each run of `a`, the runs of `b` that meet it form one range; only the same block id
    of another group may be in it (consecutive runs hold different block ids, unless there is
    one block, so the first two runs of the range decide). Beyond `2 * _WITNESS_SEARCH` runs
    the middle runs go unexamined, so an unproved pair is refused.
    """
    head = range(min(a.count, _WITNESS_SEARCH))
    tail = range(max(a.count - _WITNESS_SEARCH, len(head)), a.count)
    for run_a in (*head, *tail):
        low = a.start + run_a * a.period
        high = low + a.run
        first = max(0, (low - b.start - b.run) // b.period + 1) if b.period else 0
        last = min(b.count - 1, (high - 1 - b.start) // b.period) if b.period else (
            0 if b.start < high and low < b.start + b.run else -1)
        for run_b in range(first, min(last, first + 1) + 1):
            if a.group != b.group and run_b % num_blocks == run_a % num_blocks:
                continue
            byte = max(low, b.start + run_b * b.period)
            _clash(pool, a, run_a, b, run_b, byte, num_blocks)
    if len(head) + len(tail) < a.count:
        raise PlanInvariantError(
            f"tensors[{a.tensor}] layer {a.layer!r} (block stride {a.period}) and "
            f"tensors[{b.tensor}] layer {b.layer!r} (block stride {b.period}) cover "
            f"overlapping bytes of the {pool} pool with different block strides, which cannot "
            "be proved apart; expected layers that share bytes to share a block stride",
            tensor=a.tensor, layer=a.layer,
        )
