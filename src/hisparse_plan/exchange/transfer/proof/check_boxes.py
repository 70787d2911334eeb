"""What a row writes, as logical boxes (layers x units x global heads x row bytes), and the
proof that one destination rank's boxes of one layer tile exactly what it needs: no byte
twice, none missing (see docs/transfer.md#the-proof). Cost: a sort of the boxes."""

from __future__ import annotations

from dataclasses import dataclass

from hisparse_plan.exchange.transfer.facts.byte_layout import ByteLayout
from hisparse_plan.exchange.transfer.proof.check_walk import Level, Positions


@dataclass(frozen=True, slots=True)
class Box:
    """Layers `layers[0]..layers[1]` (indices into the pattern's layers) x units x heads x
    logical row bytes, each [first, stop)."""

    layers: tuple[int, int]
    units: tuple[int, int]
    heads: tuple[int, int]
    row: tuple[int, int]

    def shifted(self, by: tuple[int, int, int, int], times: int) -> Box:
        def move(span: tuple[int, int], step: int) -> tuple[int, int]:
            return span[0] + step * times, span[1] + step * times
        return Box(move(self.layers, by[0]), move(self.units, by[1]), move(self.heads, by[2]),
                   move(self.row, by[3]))


def level_boxes(levels: tuple[Level, ...], digits: tuple[int, ...], top: int, length: int
                ) -> list[list[tuple[int, int]]]:
    """A chunk (a run of consecutive values of the levels up to `top`) as boxes of digit
    ranges per level: partial runs up to the first aligned value, then whole ones."""
    sizes = [1]
    for level in levels[:top]:
        sizes.append(sizes[-1] * level.extent)
    first = sum(digit * size for digit, size in zip(digits, sizes, strict=False))
    stop = first + length
    cuts: list[tuple[int, int, int]] = []
    at = first
    for index in range(top):
        aligned = -(-at // sizes[index + 1]) * sizes[index + 1]
        if aligned > stop:
            break
        if aligned > at:
            cuts.append((index, at, aligned))
            at = aligned
    for index in range(top, -1, -1):
        count = (stop - at) // sizes[index]
        if count:
            cuts.append((index, at, at + count * sizes[index]))
            at += count * sizes[index]
    boxes = []
    for index, low, high in cuts:
        ranges: list[tuple[int, int]] = []
        for level_index, level in enumerate(levels):
            if level_index < index:
                ranges.append((0, level.extent))
            elif level_index <= top:
                size = sizes[level_index]
                digit = low // size if level_index == top else low // size % level.extent
                span = (high - low) // size if level_index == index else 1
                ranges.append((digit, digit + span))
            else:
                ranges.append((digits[level_index], digits[level_index] + 1))
        boxes.append(ranges)
    return boxes


def logical_box(pattern: ByteLayout, levels: tuple[Level, ...], ranges: list[tuple[int, int]],
                positions: Positions) -> Box | None:
    """Digit ranges as a logical box; None when its blocks are not consecutive positions of
    the request (or not the request's)."""
    layers, heads, row = (0, 1), (0, 1), (0, 0)
    units_in_block, blocks = (0, 1), (0, 1)
    slot: tuple[int, int] | None = None
    for level, span in zip(levels, ranges, strict=True):
        if level.kind == "byte":
            row = span
        elif level.kind == "head":
            heads = span
        elif level.kind == "unit":
            units_in_block = span
        elif level.kind == "slot":
            slot = span
        elif level.kind == "block":
            blocks = span
        else:
            layers = span
    per_block = pattern.units
    if slot is not None:
        low, last = slot[0] // per_block, (slot[1] - 1) // per_block
        where = positions.span(low, last)
        if where is None:
            return None
        first = where * per_block + slot[0] % per_block
        units = (first, first + slot[1] - slot[0])
    else:
        where = positions.span(blocks[0], blocks[1] - 1)
        if where is None:
            return None
        if blocks[1] - blocks[0] > 1 and units_in_block != (0, per_block):
            return None
        base = where * per_block
        units = (base + units_in_block[0], base + units_in_block[1]
                 + (blocks[1] - blocks[0] - 1) * per_block)
    origin = pattern.head_origin
    return Box(layers, units, (origin + heads[0], origin + heads[1]),
               (pattern.lo + row[0], pattern.lo + row[1]))


def union_of_steps(boxes: list[Box], step: tuple[int, int, int, int], count: int,
                   limit: int) -> list[Box] | None:
    """The boxes of every chunk of a row: one box grown along the one dimension the row
    steps in where the steps tile it; else each chunk's boxes (at most `limit` of them);
    None past that."""
    if count == 1:
        return boxes
    moving = [index for index, value in enumerate(step) if value]
    if len(boxes) == 1 and len(moving) == 1:
        box, axis = boxes[0], moving[0]
        spans = [box.layers, box.units, box.heads, box.row]
        first, stop = spans[axis]
        if step[axis] == stop - first:
            spans[axis] = (first, first + step[axis] * count)
            return [Box(spans[0], spans[1], spans[2], spans[3])]
    if count * len(boxes) > limit:
        return None
    return [box.shifted(step, times) for times in range(count) for box in boxes]


@dataclass(frozen=True, slots=True)
class Written:
    """One box one row writes into one layer of one destination rank."""

    units: tuple[int, int]
    heads: tuple[int, int]
    row: tuple[int, int]
    index: int
    """The row."""


def overlap(a: Written, b: Written) -> bool:
    return all(x[0] < y[1] and y[0] < x[1] for x, y in ((a.units, b.units),
                                                        (a.heads, b.heads), (a.row, b.row)))


def first_overlap(boxes: list[Written]) -> tuple[Written, Written] | None:
    """Two boxes that share a logical byte, or None. Boxes are sorted by units and swept
    within families: the boxes of (heads, row) rectangles that overlap, joined transitively
    (usually each rectangle is one family: a head range and a field)."""
    by_rectangle: dict[tuple[tuple[int, int], tuple[int, int]], list[Written]] = {}
    for box in boxes:
        by_rectangle.setdefault((box.heads, box.row), []).append(box)
    rectangles = list(by_rectangle)
    parent = list(range(len(rectangles)))

    def root(index: int) -> int:
        while parent[index] != index:
            parent[index] = parent[parent[index]]
            index = parent[index]
        return index

    for index, a in enumerate(rectangles):
        for other in range(index + 1, len(rectangles)):
            b = rectangles[other]
            if a[0][0] < b[0][1] and b[0][0] < a[0][1] and a[1][0] < b[1][1] \
                    and b[1][0] < a[1][1]:
                parent[root(other)] = root(index)
    families: dict[int, list[Written]] = {}
    for index, rectangle in enumerate(rectangles):
        families.setdefault(root(index), []).extend(by_rectangle[rectangle])
    for family in families.values():
        family.sort(key=lambda box: box.units)
        for index, box in enumerate(family):
            for later in family[index + 1:]:
                if later.units[0] >= box.units[1]:
                    break
                if overlap(box, later):
                    return box, later
    return None


def covered(boxes: list[Written], units: tuple[int, int], heads: tuple[int, int],
            row: tuple[int, int]) -> int:
    """Logical bytes of the needed box (units x heads x row) that `boxes` write."""
    total = 0
    for box in boxes:
        extent = 1
        for have, need in ((box.units, units), (box.heads, heads), (box.row, row)):
            extent *= max(0, min(have[1], need[1]) - max(have[0], need[0]))
        total += extent
    return total
