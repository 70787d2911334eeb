"""One row, both sides: decode, walk and step each side in closed form (check_walk), and
prove they move the same logical bytes in the same order (see docs/transfer.md#the-proof)."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

from hisparse_plan.exchange.transfer.facts.byte_layout import ByteLayout
from hisparse_plan.exchange.transfer.proof.check_boxes import (
    Box,
    level_boxes,
    logical_box,
    union_of_steps,
)
from hisparse_plan.exchange.transfer.proof.check_context import Frame
from hisparse_plan.exchange.transfer.proof.check_walk import (
    Level,
    Positions,
    carried,
    decode,
    levels_of,
    walk,
)

STEP_BOXES_LIMIT = 4096
"""A row whose chunks do not tile one box is proved chunk by chunk, up to this many boxes."""


@dataclass
class Side:
    """One rank of one side, as check_transfer reads it."""

    patterns: dict[str, list[ByteLayout]]
    """By region."""
    sizes: dict[str, int]
    """Region -> bytes."""
    positions: dict[str, Positions]
    """Table -> the request's blocks."""
    by_layer: dict[str, list[ByteLayout]]
    levels: dict[int, tuple[Level, ...]]

    @classmethod
    def of(cls, patterns: dict[str, list[ByteLayout]], sizes: dict[str, int],
           positions: dict[str, Positions]) -> Side:
        by_layer: dict[str, list[ByteLayout]] = {}
        for found in patterns.values():
            for pattern in found:
                for name in pattern.layers:
                    by_layer.setdefault(name, []).append(pattern)
        return cls(patterns, sizes, positions, by_layer, {})

    def levels_for(self, pattern: ByteLayout) -> tuple[Level, ...]:
        key = id(pattern)
        if key not in self.levels:
            self.levels[key] = levels_of(pattern)
        return self.levels[key]

    def find(self, region: str, hint: str, address: int
             ) -> tuple[ByteLayout, tuple[Level, ...], tuple[int, ...]] | None:
        """The pattern (of the hinted layer first) whose byte `address` is, with its digits."""
        hinted = [p for p in self.by_layer.get(hint, ()) if p.region == region]
        for pattern in (*hinted, *self.patterns.get(region, ())):
            levels = self.levels_for(pattern)
            digits = decode(pattern, levels, address)
            if digits is not None:
                return pattern, levels, digits
        return None


@dataclass(frozen=True, slots=True)
class Reading:
    """One side of one row in logical terms."""

    start: tuple[str, int, int, int]
    """(layer, unit, global head, logical row byte) of the first byte."""
    shape: list[object]
    step: tuple[int, int, int, int]
    """(layers, units, heads, row bytes) one chunk moves."""
    layers: list[str]
    """The layer of each chunk's first byte where the row steps over layers; else []."""
    touched: tuple[str, ...]
    """The layers one chunk runs through when it wraps over layers; else ()."""
    boxes: list[Box]
    pattern: ByteLayout


def read(side: Side, region: str, offset: int, length: int, count: int, stride: int,
         hint: str, frame: Frame | None = None) -> Reading | str:
    """One side of a row, or why it cannot be read; `frame` maps its units to a DCP
    destination rank's own (check_context)."""
    found = side.find(region, hint, offset)
    if found is None:
        return f"byte {offset} of {region!r} is no byte of a moved layer"
    pattern, levels, digits = found
    walked = walk(pattern, levels, digits, length)
    if walked is None:
        return (f"the chunk of {length} bytes from byte {offset} of {region!r} leaves "
                "the layer's contiguous bytes")
    top, top_last = walked
    positions = side.positions[pattern.table]
    delta = tuple(0 for _ in levels)
    following: tuple[int, ...] | None = None
    if count > 1:
        following = decode(pattern, levels, offset + stride)
        if following is None:
            return f"the row's second chunk (byte {offset + stride}) is no byte of its layer"
        delta = tuple(b - a for a, b in zip(digits, following, strict=True))
        reason = _steady(levels, digits, delta, top, top_last, count)
        if reason is not None:
            return reason
    unit_step = _unit_step(pattern, levels, digits, following, top, top_last, count,
                           positions)
    if isinstance(unit_step, str):
        return unit_step
    boxes: list[Box] = []
    for ranges in level_boxes(levels, digits, top, length):
        box = logical_box(pattern, levels, ranges, positions)
        if box is None:
            return f"byte {offset} of {region!r} lies in a block that is not the request's"
        boxes.append(box)
    if frame is not None:
        framed = frame(pattern, boxes, unit_step, count)
        if isinstance(framed, str):
            return framed
        boxes, unit_step = framed
    step = _logical_step(levels, delta, unit_step)
    layer_index = _digit(levels, digits, "layer")
    first = boxes[0]
    start = (pattern.layers[layer_index], first.units[0], first.heads[0], first.row[0])
    layer_step = _digit(levels, delta, "layer")
    chunk_layers = [pattern.layers[layer_index + i * layer_step] for i in range(count)
                    ] if layer_step else []
    touched = tuple(pattern.layers[layer_index: top_last + 1]) \
        if levels[top].kind == "layer" else ()
    grown = union_of_steps(boxes, step, count, STEP_BOXES_LIMIT)
    if grown is None:
        return f"its {count} chunks do not tile a box and are too many to prove one by one"
    return Reading(start, carried(pattern, levels, top), step, chunk_layers, touched, grown,
                   pattern)


def _digit(levels: tuple[Level, ...], digits: tuple[int, ...], kind: str) -> int:
    return next((d for level, d in zip(levels, digits, strict=True) if level.kind == kind), 0)


def _steady(levels: tuple[Level, ...], digits: tuple[int, ...], delta: tuple[int, ...],
            top: int, top_last: int, count: int) -> str | None:
    """Every chunk of the row is the first one moved by one digit step, all in range."""
    if not any(delta):
        return "its chunks repeat the first chunk"
    if any(delta[:top]):
        return "its stride moves the chunk inside its own wraps"
    last = count - 1
    for index in range(top, len(levels)):
        low, high = digits[index], top_last if index == top else digits[index]
        ends = (low + last * delta[index], high + last * delta[index])
        if min(low, *ends) < 0 or max(high, *ends) >= levels[index].extent:
            return (f"its chunk {last} runs past the {levels[index].kind} axis of its layer "
                    f"(extent {levels[index].extent})")
    return None


def _unit_step(pattern: ByteLayout, levels: tuple[Level, ...], digits: tuple[int, ...],
               following: tuple[int, ...] | None, top: int, top_last: int, count: int,
               positions: Positions) -> int | str:
    """Units one chunk of the row moves, in closed form where it can: every block any chunk
    touches is one run of consecutive ids at consecutive positions (units then follow the
    digits), or each chunk lies in one block and the chunks' blocks step evenly through
    consecutive positions. Otherwise each chunk's blocks are looked up (a row whose chunks
    each span a run of blocks, the runs apart: one lookup per chunk)."""
    if following is None:
        return 0
    delta = tuple(b - a for a, b in zip(digits, following, strict=True))
    per_block = pattern.units
    within = sum(step for level, step in zip(levels, delta, strict=True)
                 if level.kind == "unit")
    index = next(i for i, level in enumerate(levels) if level.kind in ("slot", "block"))
    slot = levels[index].kind == "slot"
    low, high = digits[index], top_last if index == top else digits[index]
    step = delta[index]
    shift = (count - 1) * step
    to_block = per_block if slot else 1
    first_low, last_high = min(low, low + shift), max(high, high + shift)
    if positions.span(first_low // to_block, last_high // to_block) is not None:
        return within + step * (1 if slot else per_block)
    moved, rest = divmod(step, to_block)
    if slot:
        within = rest
        if high % per_block + (count - 1) * rest >= per_block:
            moved = 0  # the chunks' units wrap into another block: not one block each
    if low // to_block == high // to_block and moved \
            and positions.steps(low // to_block, moved, count) is not None:
        return per_block + within
    return _each_chunk(pattern, levels, digits, delta, index, (low, high), count, positions)


def _each_chunk(pattern: ByteLayout, levels: tuple[Level, ...], digits: tuple[int, ...],
                delta: tuple[int, ...], index: int, span: tuple[int, int], count: int,
                positions: Positions) -> int | str:
    """Units one chunk moves, looked up chunk by chunk: each chunk's blocks one run of
    the request, its first unit one step past the last chunk's."""
    slot = levels[index].kind == "slot"
    to_block = pattern.units if slot else 1
    unit_level = next((i for i, level in enumerate(levels) if level.kind == "unit"), None)
    units: list[int] = []
    for chunk in range(count):
        low, high = span[0] + chunk * delta[index], span[1] + chunk * delta[index]
        at = positions.span(low // to_block, high // to_block)
        if at is None:
            return (f"chunk {chunk} touches blocks of table {pattern.table!r} that are not "
                    "consecutive blocks of the request")
        n = low % pattern.units if slot else 0
        if unit_level is not None:
            n = digits[unit_level] + chunk * delta[unit_level]
        units.append(at * pattern.units + n)
    steps = {b - a for a, b in pairwise(units)}
    if len(steps) != 1:
        return f"its chunks' units {units[:4]}... do not step evenly"
    return steps.pop()


def _logical_step(levels: tuple[Level, ...], delta: tuple[int, ...], units: int
                  ) -> tuple[int, int, int, int]:
    """(layers, units, heads, row bytes) one chunk of the row moves."""
    layers = heads = row = 0
    for level, step in zip(levels, delta, strict=True):
        if level.kind == "byte":
            row = step
        elif level.kind == "head":
            heads = step
        elif level.kind == "layer":
            layers = step
    return layers, units, heads, row


def same(source: Reading, destination: Reading) -> str | None:
    """Why two sides of a row move different logical bytes, or None when they move the same
    in the same order."""
    if source.start != destination.start:
        return (f"it reads (layer, unit, head, byte) {source.start} but writes where "
                f"{destination.start} belongs")
    if source.shape != destination.shape:
        return "its chunk runs through the row in another order on each side"
    if source.touched != destination.touched:
        return "its chunk runs through other layers on each side"
    if source.step[1:] != destination.step[1:]:
        return (f"its chunks step by (units, heads, bytes) {source.step[1:]} on the source "
                f"and {destination.step[1:]} on the destination")
    if source.layers != destination.layers:
        return "its chunks step through other layers on each side"
    return None
