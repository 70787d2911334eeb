"""Byte arithmetic for the plan-edit oracle: every element of a strided view enumerated (numpy),
and relations between byte intervals found by sorting them. Nothing here reads a plan or calls
the checker; the oracles in plan_edit_oracle_*.py feed it numbers.

An element run is a half-open byte interval [start, start + length). A view's elements are
enumerated exactly; only inner axes that tile a contiguous block (taken by ascending stride,
each stride the elements already covered) are folded into one run, which changes neither which
bytes are reached nor how often.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

import numpy as np
import numpy.typing as npt

Ints = npt.NDArray[np.int64]

MAX_RUNS = 4_000_000
"""Runs one view may enumerate; more than this is reported as unjudged, never guessed."""


class TooLarge(Exception):
    """A view or a page list that would take more runs than MAX_RUNS to enumerate."""


def end_byte(shape: Sequence[int], strides: Sequence[int], offset: int, itemsize: int) -> int:
    """One past the last byte any element reaches (0 for a view without elements)."""
    if prod(shape) == 0:
        return 0
    last = offset + sum((n - 1) * s for n, s in zip(shape, strides, strict=True))
    return (last + 1) * itemsize


def self_aliasing_axis(shape: Sequence[int], strides: Sequence[int]) -> int | None:
    """An axis of more than one element whose stride is 0: two indices, one address."""
    for axis, (n, s) in enumerate(zip(shape, strides, strict=True)):
        if n > 1 and s == 0:
            return axis
    return None


def row_runs(
    shape: Sequence[int], strides: Sequence[int], offset: int, itemsize: int, lead: int
) -> tuple[Ints, int]:
    """Every element of a strided view as runs: (starts, run bytes), starts of shape (rows,
    runs a row), rows the product of the first `lead` extents in C order. Offsets, strides
    and the result are in bytes only after multiplying by `itemsize` (the view counts
    elements)."""
    if prod(shape) == 0:
        return np.zeros((prod(shape[:lead]), 0), dtype=np.int64), itemsize
    run = 1
    enumerated: list[tuple[int, int]] = []
    merging = True
    # An element's address is a sum over axes, so the order of the inner axes does not change
    # which addresses occur (or how often). Taken by ascending stride, axes whose stride is the
    # run so far cover [0, run * n) once each (mixed radix): one run. The rest are enumerated.
    axes = sorted(zip(strides[lead:], shape[lead:], strict=True))
    for s, n in axes:
        if n == 1:
            continue  # index 0 only: adds nothing
        if merging and s == run:
            run *= n
        else:
            merging = False
            enumerated.append((n, s))
    rows = prod(shape[:lead])
    per_row = prod(n for n, _ in enumerated)
    if rows * per_row > MAX_RUNS:
        raise TooLarge(f"{rows * per_row} runs")
    inner = np.zeros(1, dtype=np.int64)
    for n, s in enumerated:
        inner = (inner[:, None] + np.arange(n, dtype=np.int64)[None, :] * s).ravel()
    outer = np.full(1, offset, dtype=np.int64)
    for n, s in zip(shape[:lead], strides[:lead], strict=True):
        outer = (outer[:, None] + np.arange(n, dtype=np.int64)[None, :] * s).ravel()
    starts = (outer[:, None] + inner[None, :]) * itemsize
    return starts, run * itemsize


def first_overlap(starts: Ints, ends: Ints) -> tuple[int, int] | None:
    """Indices of two intervals that share a byte, or None when all are disjoint."""
    if starts.size < 2:
        return None
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)
    clash = np.nonzero(s[1:] < reach[:-1])[0]
    if clash.size == 0:
        return None
    later = int(clash[0]) + 1
    earlier = int(np.nonzero(e[:later] > s[later])[0][0])
    return int(order[earlier]), int(order[later])


def merge_touching(starts: Ints, ends: Ints, keys: Ints) -> tuple[Ints, Ints, Ints]:
    """Disjoint intervals sorted by start; neighbours that touch and share a key become one."""
    order = np.argsort(starts, kind="stable")
    s, e, k = starts[order], ends[order], keys[order]
    if s.size == 0:
        return s, e, k
    new = np.ones(s.size, dtype=bool)
    new[1:] = (s[1:] != e[:-1]) | (k[1:] != k[:-1])
    first = np.nonzero(new)[0]
    last = np.r_[first[1:] - 1, s.size - 1]
    return s[first], e[last], k[first]


def inside(
    starts: Ints, ends: Ints, owner_starts: Ints, owner_ends: Ints
) -> npt.NDArray[np.intp]:
    """For each interval, the index of the (sorted, disjoint) owner interval holding it
    whole, else -1."""
    if owner_starts.size == 0:
        return np.full(starts.size, -1, dtype=np.intp)
    at = np.searchsorted(owner_starts, starts, side="right") - 1
    safe = np.maximum(at, 0)
    held = (at >= 0) & (ends <= owner_ends[safe])
    return np.where(held, at, -1)


def union(starts: Ints, ends: Ints) -> tuple[Ints, Ints]:
    """The union of intervals as sorted, disjoint, non-touching intervals."""
    if starts.size == 0:
        return starts, ends
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)
    new = np.ones(s.size, dtype=bool)
    new[1:] = s[1:] > reach[:-1]
    first = np.nonzero(new)[0]
    last = np.r_[first[1:] - 1, s.size - 1]
    return s[first], reach[last]
