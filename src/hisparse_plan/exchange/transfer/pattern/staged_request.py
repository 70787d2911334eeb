"""One request through a proved staged pattern (see docs/transfer.md#staged-transfers): the
pattern's own instantiation checks the request's blocks; each (slab, source block) the
request reads gets a slot in its slab's staging area, in ascending block id; a request
larger than an area moves in rounds. All in numpy, no Python loop per block or per row;
executors loop per *move*: one pattern row over a run of entries whose staging slot and
destination block step evenly (a run of consecutive ids is one move)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np
from numpy.typing import NDArray

from hisparse_plan.exchange.transfer.errors import TransferCheckError
from hisparse_plan.exchange.transfer.pattern.instance import Instantiated
from hisparse_plan.exchange.transfer.pattern.parts import Slab
from hisparse_plan.exchange.transfer.pattern.transfer_pattern import TransferPattern
from hisparse_plan.exchange.transfer.program.transfer_program import (
    STAGING_REGION,
    RankRegions,
    Region,
    TransferProgram,
    TransferRequest,
    TransferRow,
)

Ints = NDArray[np.int64]


class StagedShape(Protocol):
    """What a request's staging reads of a staged pattern. StagedPattern is one; it imports
    this module when a request comes, so this module never imports it."""

    @property
    def pattern(self) -> TransferPattern: ...
    @property
    def slabs(self) -> Sequence[Slab]: ...
    @property
    def row_slab(self) -> Sequence[int]: ...
    @property
    def staging_bytes(self) -> Sequence[int]: ...
    @property
    def staging_location(self) -> Literal["device", "host"]: ...


@dataclass(frozen=True)
class Phase1:
    """Each staged block: its slab, source block id and slot (one entry each)."""

    slab: Ints
    src_ids: Ints
    slot: Ints


    def runs(self, slabs: Ints | None = None) -> tuple[Ints, Ints]:
        """(first entry, blocks) of each run of consecutive block ids in consecutive slots
        of one slab; only slabs where `slabs[slab]` is true join (all when None)."""
        joined = np.zeros(self.slab.size, dtype=bool)
        if self.slab.size > 1:
            joined[1:] = ((self.slab[1:] == self.slab[:-1])
                          & (self.src_ids[1:] - self.src_ids[:-1] == 1)
                          & (self.slot[1:] - self.slot[:-1] == 1))
            if slabs is not None:
                joined[1:] &= slabs[self.slab[1:]]
        starts = np.flatnonzero(~joined)
        return starts, np.diff(np.append(starts, self.slab.size))

    def run_list(self) -> list[tuple[int, int, int, int]]:
        """Each run as (slab, first block id, first slot, blocks), for executors that copy
        a run at a time."""
        starts, sizes = self.runs()
        return list(zip(self.slab[starts].tolist(), self.src_ids[starts].tolist(),
                        self.slot[starts].tolist(), sizes.tolist(), strict=True))


@dataclass(frozen=True)
class Moves:
    """Phase 2 as moves: pattern row `rows[i]` for `size[i]` entries, the first reading
    staging byte `staging[i]` and writing destination block `dst_id[i]`, each next entry
    `staging_step[i]` bytes and `dst_step[i]` blocks further."""

    rows: Ints
    staging: Ints
    dst_id: Ints
    size: Ints
    staging_step: Ints
    dst_step: Ints

    def by_row(self) -> list[tuple[int, Ints]]:
        """(pattern row, its moves' indices) per row: the moves are ordered by row."""
        if not self.rows.size:
            return []
        bounds = np.flatnonzero(np.diff(self.rows)) + 1
        return [(int(self.rows[part[0]]), part)
                for part in np.split(np.arange(self.rows.size), bounds)]

    def entries(self, chosen: Ints | None = None) -> tuple[Ints, Ints, Ints]:
        """The moves (all, or the `chosen` ones) entry by entry: pattern row, first staging
        byte and destination block of each."""
        picked = slice(None) if chosen is None else chosen
        size = self.size[picked]
        move = np.repeat(np.arange(size.size), size)
        nth = np.arange(int(size.sum())) - np.repeat(np.cumsum(size) - size, size)
        return (self.rows[picked][move],
                self.staging[picked][move] + nth * self.staging_step[picked][move],
                self.dst_id[picked][move] + nth * self.dst_step[picked][move])


@dataclass(frozen=True)
class StagedRound:
    phase1: Phase1
    moves: Moves
    entries: int
    """Pattern rows x blocks this round writes (what the direct pattern posts)."""


@dataclass(frozen=True)
class StagedRequest:
    staged: StagedShape
    direct: Instantiated
    rounds: tuple[StagedRound, ...]

    @property
    def bytes(self) -> int:
        """Bytes written to the destination's pools (the request's own)."""
        return self.direct.bytes

    def staging_regions(self) -> list[RankRegions]:
        """The staging region of each destination rank (phase 1's destination)."""
        engine = self.staged.pattern.destination[0].engine
        return [RankRegions(rank=rank, engine=engine, regions=[Region(
                    name=STAGING_REGION, pool=STAGING_REGION, layer=None,
                    location=self.staged.staging_location, size=max(size, 1))])
                for rank, size in enumerate(self.staged.staging_bytes)]

    def gather(self, round_: StagedRound, row: int, part: Ints) -> tuple[int, Ints, Ints]:
        """One pattern row's entries of a round (its moves `part`) as the staging byte of the
        lowest one, each entry's slot counted from there, and each entry's destination block;
        TransferCheckError if the entries are not a whole number of slabs apart."""
        _, at, ids = round_.moves.entries(part)
        slab = self.staged.slabs[self.staged.row_slab[row]].length
        first = int(at.min())
        if bool(((at - first) % slab).any()):
            raise TransferCheckError(f"pattern row {row}: its staged entries are not a slab "
                                     "apart")
        return first, (at - first) // slab, ids

    def phase1_program(self, round_: StagedRound) -> TransferProgram:
        """Phase 1 of a round as rows (one per staged block), for the reference executor."""
        slabs = self.staged.slabs
        rows = []
        for slab_index, block, slot in zip(round_.phase1.slab.tolist(),
                                           round_.phase1.src_ids.tolist(),
                                           round_.phase1.slot.tolist(), strict=True):
            slab = slabs[slab_index]
            rows.append(TransferRow.model_construct(
                src_rank=slab.src_rank, src_region=slab.src_region,
                src_offset=slab.offset + block * slab.block_stride, length=slab.length,
                count=1, src_stride=0, dst_rank=slab.dst_rank, dst_region=STAGING_REGION,
                dst_offset=slab.staging_offset + slot * slab.length, dst_stride=0,
                layer=f"slab {slab_index}"))
        return self._program(self.staged.pattern.source, self.staging_regions(), rows)

    def phase2_program(self, round_: StagedRound) -> TransferProgram:
        """Phase 2 of a round as rows (one per entry): the direct rows, read from staging."""
        pattern, moves = self.staged.pattern, round_.moves
        rows = []
        for index, first, dst_first, size, step, dst_step in zip(
                moves.rows.tolist(), moves.staging.tolist(), moves.dst_id.tolist(),
                moves.size.tolist(), moves.staging_step.tolist(), moves.dst_step.tolist(),
                strict=True):
            row = pattern.rows[index]
            for entry in range(size):
                rows.append(TransferRow.model_construct(
                    src_rank=row.dst_rank, src_region=STAGING_REGION,
                    src_offset=first + entry * step, length=row.length, count=row.count,
                    src_stride=row.src_stride, dst_rank=row.dst_rank,
                    dst_region=row.dst_region,
                    dst_offset=row.dst_offset + (dst_first + entry * dst_step)
                    * row.dst_block_stride,
                    dst_stride=row.dst_stride, layer=row.layer))
        return self._program(self.staging_regions(), pattern.destination, rows)

    def _program(self, source: list[RankRegions], destination: list[RankRegions],
                 rows: list[TransferRow]) -> TransferProgram:
        return TransferProgram(request=self.direct.request, source=source,
                               destination=destination, layers=self.staged.pattern.layers,
                               rows=rows)


def instantiate_staged(staged: StagedShape, request: TransferRequest) -> StagedRequest:
    """See StagedPattern.instantiate."""
    direct = staged.pattern.instantiate(request)
    slabs = staged.slabs
    row_slab = np.asarray(staged.row_slab, dtype=np.int64)
    lengths = np.array([s.length for s in slabs], dtype=np.int64)
    bases = np.array([s.staging_offset for s in slabs], dtype=np.int64)
    offsets = np.array([s.offset for s in slabs], dtype=np.int64)
    slots = np.array([s.slots for s in slabs], dtype=np.int64)
    src_offset = np.array([row.src_offset for row in staged.pattern.rows], dtype=np.int64)
    entry_slab = row_slab[direct.rows]
    span = int(direct.src_ids.max()) + 1 if direct.src_ids.size else 1
    staged_blocks, entry_block = np.unique(entry_slab * span + direct.src_ids,
                                           return_inverse=True)
    block_slab, block_id = staged_blocks // span, staged_blocks % span
    nth = np.arange(block_slab.size) - np.searchsorted(block_slab, block_slab, side="left")
    block_round, block_slot = nth // slots[block_slab], nth % slots[block_slab]
    entry_round = block_round[entry_block]
    staging = (bases[entry_slab] + block_slot[entry_block] * lengths[entry_slab]
               + src_offset[direct.rows] - offsets[entry_slab])
    rounds = []
    for number in range(int(block_round.max()) + 1 if block_round.size else 0):
        chosen = block_round == number
        phase1 = Phase1(block_slab[chosen], block_id[chosen], block_slot[chosen])
        mine = np.flatnonzero(entry_round == number)
        rounds.append(StagedRound(phase1, _moves(staged, direct.rows[mine], staging[mine],
                                                 direct.dst_ids[mine]), int(mine.size)))
    return StagedRequest(staged, direct, tuple(rounds))


def _moves(staged: StagedShape, rows: Ints, staging: Ints, dst_ids: Ints) -> Moves:
    """The entries grouped by pattern row, then cut wherever the staging slot or the
    destination block stops stepping by the row's usual step (consecutive ids give one
    move per run)."""
    pattern = staged.pattern
    order = np.lexsort((staging, rows))
    rows, staging, dst_ids = rows[order], staging[order], dst_ids[order]
    links = np.array([row.link for row in pattern.rows], dtype=np.int64)[rows]
    slab_length = np.array([staged.slabs[s].length for s in staged.row_slab],
                           dtype=np.int64)[rows]
    per_period = np.array([[link.period // link.source_units,
                            link.period // link.destination_units]
                           for link in pattern.links], dtype=np.int64).reshape(-1, 2)
    staging_step = per_period[links, 0] * slab_length
    dst_step = per_period[links, 1]
    joined = np.zeros(rows.size, dtype=bool)
    if rows.size > 1:
        joined[1:] = ((rows[1:] == rows[:-1])
                      & (staging[1:] - staging[:-1] == staging_step[1:])
                      & (dst_ids[1:] - dst_ids[:-1] == dst_step[1:]))
    starts = np.flatnonzero(~joined)
    size = np.diff(np.append(starts, rows.size))
    return Moves(rows[starts], staging[starts], dst_ids[starts], size, staging_step[starts],
                 dst_step[starts])
