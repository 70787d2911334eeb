"""One side of one row, in closed form: decode the first chunk's first byte to logical
coordinates, walk the chunk up the pattern's packed levels, and step the row's count along
the one progression its stride makes (see docs/transfer.md#the-proof).

A side's address is a mixed-radix number over its pattern's levels (byte, then the other axes
by stride); a contiguous chunk runs through consecutive values of the packed levels, so it is
described by its start, the levels it wraps (with their extents and origins) and the level it
stops in. Two sides move the same logical bytes in the same order exactly when those
descriptions are equal; no byte is enumerated.
"""

from __future__ import annotations

from dataclasses import dataclass

from hisparse_plan.exchange.transfer.facts.byte_layout import ByteLayout


@dataclass(frozen=True, slots=True)
class Positions:
    """A request's blocks in one table: block id -> position, and for each position how far
    the ids keep one step from it (so "blocks b, b + d, b + 2d, ... at consecutive
    positions" is one lookup)."""

    ids: tuple[int, ...]
    position: dict[int, int]
    reach: tuple[int, ...]
    """reach[p]: the last position q with ids[p..q] one step apart (p itself at the end)."""

    @classmethod
    def of(cls, ids: list[int], first: int) -> Positions:
        position = {block: at for at, block in enumerate(ids) if at >= first}
        reach = list(range(len(ids)))
        for at in range(len(ids) - 2, -1, -1):
            reach[at] = at + 1
            if at + 2 < len(ids) and ids[at + 2] - ids[at + 1] == ids[at + 1] - ids[at]:
                reach[at] = reach[at + 1]
        return cls(tuple(ids), position, tuple(reach))

    def steps(self, block: int, step: int, count: int) -> int | None:
        """The position of `block` when blocks block + i * step (i < count) are the request's
        consecutive positions; else None."""
        at = self.position.get(block)
        if at is None or count == 1:
            return at
        if at + 1 >= len(self.ids) or self.ids[at + 1] - self.ids[at] != step \
                or self.reach[at] < at + count - 1:
            return None
        return at

    def span(self, low: int, high: int) -> int | None:
        """The position of block `low` when blocks low..high are consecutive positions."""
        return self.steps(low, 1, high - low + 1) if high >= low else None


@dataclass(frozen=True, slots=True)
class Level:
    kind: str
    """byte, head, unit, slot (unit and block merged), block or layer."""
    stride: int
    extent: int


@dataclass(frozen=True, slots=True)
class Walk:
    """One side of a row, decoded."""

    pattern: ByteLayout
    levels: tuple[Level, ...]
    digits: tuple[int, ...]
    top: int
    """The level the chunk stops in; below it every level wraps."""
    top_last: int
    """The chunk's last digit at the top level."""
    step: tuple[int, ...]
    """Digits one chunk of the row moves (zeros for a row of one chunk)."""


def levels_of(pattern: ByteLayout) -> tuple[Level, ...]:
    """The byte level, then the pattern's axes narrowest first; a unit axis and the block axis
    that packs it merge into one slot level (units run on across consecutive blocks)."""
    axes = sorted(pattern.axes, key=lambda axis: axis.stride)
    levels = [Level("byte", 1, pattern.size)]
    index = 0
    while index < len(axes):
        axis = axes[index]
        following = axes[index + 1] if index + 1 < len(axes) else None
        if axis.kind == "unit" and following is not None and following.kind == "block" \
                and following.stride == axis.stride * axis.extent:
            levels.append(Level("slot", axis.stride, axis.extent * following.extent))
            index += 2
            continue
        levels.append(Level(axis.kind, axis.stride, axis.extent))
        index += 1
    return tuple(levels)


def decode(pattern: ByteLayout, levels: tuple[Level, ...], address: int) -> tuple[int, ...] | None:
    """The level digits of `address`, or None when it is no byte of the pattern."""
    rest = address - pattern.base
    if rest < 0:
        return None
    digits = [0] * len(levels)
    for index in range(len(levels) - 1, 0, -1):
        level = levels[index]
        digit = rest // level.stride
        if digit >= level.extent:
            return None
        digits[index] = digit
        rest -= digit * level.stride
    if rest >= pattern.size:
        return None
    digits[0] = rest
    return tuple(digits)


def walk(pattern: ByteLayout, levels: tuple[Level, ...], digits: tuple[int, ...], length: int
         ) -> tuple[int, int] | None:
    """(top level, its last digit) of a chunk of `length` bytes from `digits`, or None when
    the chunk leaves the pattern's contiguous bytes."""
    merged, capacity, top = digits[0], levels[0].extent, 0
    while merged + length > capacity:
        if top + 1 == len(levels) or levels[top].kind in ("slot", "block") \
                or levels[top + 1].stride != capacity:
            return None
        top += 1
        merged += digits[top] * capacity
        capacity *= levels[top].extent
    below = capacity // levels[top].extent
    return top, (merged + length - 1) // below


def contiguous(levels: tuple[Level, ...], digits: tuple[int, ...]) -> int:
    """Bytes from `digits` to the end of the pattern's contiguous run (up its packed levels,
    never past a slot or block level)."""
    merged, capacity, top = digits[0], levels[0].extent, 0
    while top + 1 < len(levels) and levels[top].kind not in ("slot", "block") \
            and levels[top + 1].stride == capacity:
        top += 1
        merged += digits[top] * capacity
        capacity *= levels[top].extent
    return capacity - merged


def carried(pattern: ByteLayout, levels: tuple[Level, ...], top: int) -> list[object]:
    """What the chunk's wraps look like in logical terms: two sides with equal lists (and
    equal starts) run through the same logical bytes."""
    found: list[object] = []
    for level in levels[:top]:
        if level.kind == "byte":
            found.append(("byte", level.extent, pattern.lo))
        elif level.kind == "head":
            found.append(("head", level.extent, pattern.head_origin))
        elif level.kind == "unit":
            found.append(("unit", level.extent))
        else:
            found.append(("layer", pattern.layers))
    kind = levels[top].kind
    if kind in ("slot", "unit"):
        found.append(("top", "unit", 1))
    elif kind == "block":
        found.append(("top", "unit", pattern.units))
    else:
        found.append(("top", kind, 1))
    return found
