"""One request through a proved pattern (see
docs/transfer.md#what-is-proved-once-what-per-request): its blocks checked, then each
selected row of each period as (pattern row, source block id, destination block id), in
numpy, with no Python loop per block or per row. numpy is imported with this module, which
the package never imports (TransferPattern.instantiate does, on first use)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from hisparse_plan.exchange.transfer.errors import TransferCheckError, TransferRefused
from hisparse_plan.exchange.transfer.pattern.parts import PatternLink, PatternRow, PatternTable
from hisparse_plan.exchange.transfer.program.transfer_program import (
    RankRegions,
    TransferProgram,
    TransferRequest,
    TransferRow,
)

Ints = NDArray[np.int64]


@dataclass(frozen=True)
class LinkArrays:
    """One link's rows as columns (index: the row's place in the pattern)."""

    rows: Ints
    unit_start: Ints
    src_slot: Ints
    dst_slot: Ints


@dataclass(frozen=True, eq=False)
class PatternArrays:
    """A pattern's rows as numpy columns, cached on the pattern (compared by identity, so
    that two patterns compare by their fields whether or not a request made them)."""

    links: tuple[LinkArrays, ...]
    src_offset: Ints
    src_block_stride: Ints
    dst_offset: Ints
    dst_block_stride: Ints
    count: Ints
    length: Ints


class PatternShape(Protocol):
    """What a request's instantiation reads of a pattern. TransferPattern is one; it imports
    this module when a request comes, so this module never imports it."""

    @property
    def source(self) -> Sequence[RankRegions]: ...
    @property
    def destination(self) -> Sequence[RankRegions]: ...
    @property
    def source_tables(self) -> Sequence[PatternTable]: ...
    @property
    def destination_tables(self) -> Sequence[PatternTable]: ...
    @property
    def shared(self) -> Sequence[tuple[str, str, str]]: ...
    @property
    def layers(self) -> Sequence[str]: ...
    @property
    def links(self) -> Sequence[PatternLink]: ...
    @property
    def rows(self) -> Sequence[PatternRow]: ...
    @property
    def arrays(self) -> PatternArrays: ...


def pattern_arrays(pattern: PatternShape) -> PatternArrays:
    def column(name: str) -> Ints:
        return np.array([getattr(row, name) for row in pattern.rows], dtype=np.int64)

    link = column("link")
    start, src_slot, dst_slot = column("unit_start"), column("src_slot"), column("dst_slot")
    links = []
    for index in range(len(pattern.links)):
        rows = np.flatnonzero(link == index)
        links.append(LinkArrays(rows, start[rows], src_slot[rows], dst_slot[rows]))
    return PatternArrays(tuple(links), column("src_offset"), column("src_block_stride"),
                         column("dst_offset"), column("dst_block_stride"), column("count"),
                         column("length"))


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def selected_units(link: PatternLink, num_tokens: int) -> tuple[int, int]:
    """[start, stop) of the units the link's rows move for `num_tokens`: both block-aligned
    on one side at least, so every row of a period is wholly in or out. A window or chunk
    starts at `start_unit` of its first unit; the stop is where the shorter of the two last
    blocks ends (vllm's and SGLang's last block holds the request's last token; bytes past
    it stay in the request's own blocks)."""
    if link.kind == "state":
        return 0, 1
    if link.kind == "pages":
        return 0, ceil_div(num_tokens, link.tokens_per_unit)
    first = 0
    if link.window is not None:
        first = max(first, num_tokens - link.window)
    if link.chunk is not None:
        first = max(first, num_tokens // link.chunk * link.chunk)
    src, dst = link.source_units, link.destination_units
    return start_unit(link, first), min(ceil_div(num_tokens, src) * src,
                                        ceil_div(num_tokens, dst) * dst)


def start_unit(link: PatternLink, first: int) -> int:
    """Where a selection whose first needed unit is `first` starts: the later of the two
    sides' block starts at or before it, so no block before the one holding that unit is
    read or written."""
    src, dst = link.source_units, link.destination_units
    return max(first // src * src, first // dst * dst)


@dataclass(frozen=True)
class Instantiated:
    """One request's rows: `rows[i]` of the pattern at source block `src_ids[i]` and
    destination block `dst_ids[i]` (numpy columns, one entry per moved row and block)."""

    pattern: PatternShape
    request: TransferRequest
    rows: Ints
    src_ids: Ints
    dst_ids: Ints

    @property
    def entries(self) -> int:
        """Rows an executor with prepared lists posts (one per row and block)."""
        return int(self.rows.size)

    @property
    def chunks(self) -> int:
        """Contiguous copies (what NIXL posts: a strided entry is its count of copies)."""
        return int(self.pattern.arrays.count[self.rows].sum())

    @property
    def bytes(self) -> int:
        arrays = self.pattern.arrays
        return int((arrays.count[self.rows] * arrays.length[self.rows]).sum())

    def offsets(self) -> tuple[Ints, Ints]:
        """Each entry's first byte in its source and destination region."""
        arrays = self.pattern.arrays
        return (arrays.src_offset[self.rows] + self.src_ids * arrays.src_block_stride[self.rows],
                arrays.dst_offset[self.rows] + self.dst_ids * arrays.dst_block_stride[self.rows])

    def program(self) -> TransferProgram:
        """The same request as a TransferProgram (rows), for executors without prepared
        lists and for check_transfer."""
        src, dst = self.offsets()
        rows = []
        for index, src_offset, dst_offset in zip(self.rows.tolist(), src.tolist(), dst.tolist(),
                                                 strict=True):
            row = self.pattern.rows[index]
            rows.append(TransferRow.model_construct(
                src_rank=row.src_rank, src_region=row.src_region, src_offset=src_offset,
                length=row.length, count=row.count, src_stride=row.src_stride,
                dst_rank=row.dst_rank, dst_region=row.dst_region, dst_offset=dst_offset,
                dst_stride=row.dst_stride, layer=row.layer))
        return TransferProgram(request=self.request, source=list(self.pattern.source),
                               destination=list(self.pattern.destination),
                               layers=list(self.pattern.layers), rows=rows)


def instantiate(pattern: PatternShape, request: TransferRequest) -> Instantiated:
    """See TransferPattern.instantiate."""
    given = {"source": _given(pattern, request, "source"),
             "destination": _given(pattern, request, "destination")}
    selections = [_selection(link, request.num_tokens, given) for link in pattern.links]
    arrays = pattern.arrays  # sized by the pattern, after every table has its ids
    spans: dict[tuple[str, str], list[tuple[int, int]]] = {}
    parts: list[tuple[Ints, Ints, Ints]] = []
    for link, columns, (start, stop, ranges) in zip(pattern.links, arrays.links, selections,
                                                   strict=True):
        period = link.period
        periods = np.arange(start // period, ceil_div(stop, period), dtype=np.int64)
        units = periods[:, None] * period + columns.unit_start[None, :]
        keep = (units >= start) & (units < stop)
        which = np.broadcast_to(columns.rows[None, :], keep.shape)[keep]
        ids = []
        for (side, table, units_per_block, slots), (low, high) in zip((
                ("source", link.source_table, link.source_units, columns.src_slot),
                ("destination", link.destination_table, link.destination_units,
                 columns.dst_slot)), ranges, strict=True):
            blocks = given[side][table]
            spans.setdefault((side, table), []).append((low, high))
            positions = (periods[:, None] * (period // units_per_block) + slots[None, :])[keep]
            if link.kind != "state" and positions.size and (
                    int(positions.min()) < low or int(positions.max()) >= high):
                # Only a pattern check_pattern has not proved gets here.
                raise TransferCheckError(f"link {link.source_table!r} -> "
                                         f"{link.destination_table!r}: its rows read {side} "
                                         f"positions outside {low}..{high - 1}")
            ids.append(blocks[low:high][positions - low] if link.kind != "state"
                       else np.full(positions.size, blocks[-1], dtype=np.int64))
        parts.append((which, ids[0], ids[1]))
    _valid(pattern, given, spans)
    empty = np.zeros(0, dtype=np.int64)
    return Instantiated(pattern, request,
                        np.concatenate([p[0] for p in parts]) if parts else empty,
                        np.concatenate([p[1] for p in parts]) if parts else empty,
                        np.concatenate([p[2] for p in parts]) if parts else empty)


def _selection(link: PatternLink, num_tokens: int, given: dict[str, dict[str, Ints]]
               ) -> tuple[int, int, list[tuple[int, int]]]:
    """The link's selected units and, per side, the positions [low, high) of the table's ids
    they read, the request giving that many ids (checked before any array is sized: a
    request's num_tokens is bounded by what its ids hold)."""
    start, stop = selected_units(link, num_tokens)
    ranges = []
    for side, table, units_per_block in (
            ("source", link.source_table, link.source_units),
            ("destination", link.destination_table, link.destination_units)):
        blocks = _enough(side, table, given[side].get(table), 1)
        if link.kind == "state":
            low, high = blocks.size - 1, blocks.size
        else:
            low, high = start // units_per_block, ceil_div(stop, units_per_block)
        _enough(side, table, blocks, high)
        ranges.append((low, high))
    return start, stop, ranges


def _given(pattern: PatternShape, request: TransferRequest, side: str) -> dict[str, Ints]:
    """The request's blocks per table of one side, every table named being one of its own."""
    tables = pattern.source_tables if side == "source" else pattern.destination_tables
    blocks = request.source_blocks if side == "source" else request.destination_blocks
    names = {table.name for table in tables}
    for name in blocks:
        if name not in names:
            raise TransferRefused(
                f"{side}_blocks[{name!r}]: no such block table; expected one of "
                f"{sorted(names)}", what="blocks", field=f"{side}_blocks[{name!r}]")
    return {name: np.asarray(ids, dtype=np.int64) for name, ids in blocks.items()}


def _enough(side: str, table: str, blocks: Ints | None, needed: int) -> Ints:
    """The table's blocks, at least `needed` of them (and one)."""
    if blocks is None or blocks.size < max(needed, 1):
        got = "none" if blocks is None else str(blocks.size)
        raise TransferRefused(
            f"{side}_blocks[{table!r}]: the request needs {max(needed, 1)} blocks of this "
            f"table, got {got}", what="blocks", field=f"{side}_blocks[{table!r}]")
    return blocks


def _valid(pattern: PatternShape, given: dict[str, dict[str, Ints]],
           spans: dict[tuple[str, str], list[tuple[int, int]]]) -> None:
    """The blocks a request moves: each a block of its pool (not a padding block), none
    twice in a table, none in two tables that share a region."""
    used: dict[tuple[str, str], Ints] = {}
    for (side, name), ranges in spans.items():
        blocks = given[side][name]
        table = next(t for t in (pattern.source_tables if side == "source"
                                 else pattern.destination_tables) if t.name == name)
        ids = np.sort(np.concatenate([blocks[low:high] for low, high in _merged(ranges)]))
        where = f"{side}_blocks[{name!r}]"
        if ids.size and (ids[0] < table.padding_blocks or ids[-1] >= table.num_blocks):
            bad = int(ids[0] if ids[0] < table.padding_blocks else ids[-1])
            raise TransferRefused(
                f"{where}: block {bad} is not one a request is given: expected "
                f"{table.padding_blocks} <= block < {table.num_blocks}",
                what="blocks", field=where)
        if ids.size > 1 and bool((ids[1:] == ids[:-1]).any()):
            raise TransferRefused(f"{where}: a block is given twice", what="blocks", field=where)
        used[(side, name)] = ids
    for side, first, second in pattern.shared:
        a, b = used.get((side, first)), used.get((side, second))
        if a is not None and b is not None:
            common = np.intersect1d(a, b, assume_unique=True)
            if common.size:
                raise TransferRefused(
                    f"{side}_blocks: block {int(common[0])} is given to tables {first!r} and "
                    f"{second!r}, whose layers share a pool; expected each block once",
                    what="blocks", field=f"{side}_blocks[{second!r}]")


def _merged(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Position ranges joined where they overlap (the positions a table's links move)."""
    found: list[tuple[int, int]] = []
    for low, high in sorted(ranges):
        if found and low <= found[-1][1]:
            found[-1] = (found[-1][0], max(found[-1][1], high))
        else:
            found.append((low, high))
    return found
