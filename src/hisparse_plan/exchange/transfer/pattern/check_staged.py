"""check_staged: prove a staged pattern once, from the two plans (see
docs/transfer.md#staged-transfers). On top of check_pattern's proof of the rows:
- each slab lies in its source region for every block id of its table, within one block
  stride, so the slabs of two block ids never meet; the bytes it holds that no row reads are
  no other block's (no layer of the region places a byte of another block id there);
- each row reads within the one slab it is given, whose rank, table, region, block stride
  and destination rank are the row's, and two rows that may meet at one block id (rows of
  other links, or of one link and one block of its period) read disjoint bytes of it: a
  staged byte is read at most once;
- each slab's staging area (`slots` blocks) lies in its destination rank's staging region,
  apart from every other slab's: a staging byte is written at most once a round; each
  rank's staging region is exactly what its areas take (an executor allocates it).
So phase 2, reading `staging_offset + slot * length + (src_offset - offset)` for the block in
`slot`, reads what the direct row reads at that block: the two phases move what check_pattern
proved, and nothing else is written. The cost grows with rows per period, never with blocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

from hisparse_plan.exchange.transfer.errors import TransferCheckError
from hisparse_plan.exchange.transfer.facts.rank_facts import RankFacts
from hisparse_plan.exchange.transfer.facts.side import Instance, as_instance
from hisparse_plan.exchange.transfer.pattern.check_pattern import PatternProof, check_pattern
from hisparse_plan.exchange.transfer.pattern.parts import Slab
from hisparse_plan.exchange.transfer.pattern.staging import StagedPattern
from hisparse_plan.models.any_plan import Plan

Span = tuple[int, int]
Read = tuple[int, int, int, int]
"""(first byte, end, link, block of the period): a row's chunk at block id 0."""


@dataclass(frozen=True, slots=True)
class StagedProof:
    pattern: PatternProof
    slabs: int
    slab_bytes: int
    """Bytes phase 1 moves per source block of every slab (once each)."""
    unread_bytes: int
    """Of those, bytes no row reads (moved, never written to a pool)."""


def check_staged(staged: StagedPattern, source: Instance | Plan | Sequence[Plan],
                 destination: Instance | Plan | Sequence[Plan]) -> StagedProof:
    """Prove `staged` (module doc), or raise TransferCheckError naming the slab or row."""
    src, dst = as_instance(source), as_instance(destination)
    proof = check_pattern(staged.pattern, src, dst)
    pattern = staged.pattern
    if len(staged.row_slab) != len(pattern.rows):
        raise TransferCheckError(f"row_slab: expected one slab per pattern row "
                                 f"({len(pattern.rows)}), got {len(staged.row_slab)}")
    if len(staged.staging_bytes) != dst.ranks:
        raise TransferCheckError(f"staging_bytes: expected one size per destination rank "
                                 f"({dst.ranks}), got {len(staged.staging_bytes)}")
    reads: list[list[Read]] = [[] for _ in staged.slabs]
    for index, (row, slab_index) in enumerate(zip(pattern.rows, staged.row_slab, strict=True)):
        if slab_index >= len(staged.slabs):
            raise TransferCheckError(f"row {index}: slab {slab_index} does not exist "
                                     f"({len(staged.slabs)} slabs)", row=index)
        slab = staged.slabs[slab_index]
        ours = (row.src_rank, pattern.links[row.link].source_table, row.src_region,
                row.src_block_stride, row.dst_rank)
        theirs = (slab.src_rank, slab.src_table, slab.src_region, slab.block_stride,
                  slab.dst_rank)
        if ours != theirs:
            raise TransferCheckError(f"row {index}: its (source rank, table, region, block "
                                     f"stride, destination rank) are {ours}; slab "
                                     f"{slab_index} holds {theirs}", row=index)
        step = row.src_stride if row.count > 1 else row.length
        for chunk in range(row.count):
            first = row.src_offset + chunk * step
            if first < slab.offset or first + row.length > slab.offset + slab.length:
                raise TransferCheckError(
                    f"row {index}: chunk {chunk} reads bytes {first}..{first + row.length} "
                    f"of a block; slab {slab_index} holds {slab.offset}.."
                    f"{slab.offset + slab.length}", row=index)
            reads[slab_index].append((first, first + row.length, row.link, row.src_slot))
    unread = 0
    for number, slab in enumerate(staged.slabs):
        _slab_of_the_source(number, slab, src)
        gaps = _gaps(number, slab, reads[number])
        _gaps_are_the_blocks(number, slab, gaps, src.facts[slab.src_rank])
        _slab_in_region(number, slab, src.facts[slab.src_rank])
        unread += sum(hi - lo for lo, hi in gaps)
    _areas_apart(staged)
    return StagedProof(proof, len(staged.slabs), sum(s.length for s in staged.slabs), unread)


def _slab_in_region(number: int, slab: Slab, facts: RankFacts) -> None:
    end = (slab.offset + (facts.tables[slab.src_table].num_blocks - 1) * slab.block_stride
           + slab.length)
    size = facts.regions[slab.src_region].size
    if end > size:
        raise TransferCheckError(f"slab {number}: at the table's last block it ends at byte "
                                 f"{end}; region {slab.src_region!r} holds {size}")


def _slab_of_the_source(number: int, slab: Slab, src: Instance) -> None:
    if slab.src_rank >= src.ranks:
        raise TransferCheckError(f"slab {number}: source rank {slab.src_rank}; the source has "
                                 f"{src.ranks}")
    facts = src.facts[slab.src_rank]
    region = facts.regions.get(slab.src_region)
    table = facts.tables.get(slab.src_table)
    if region is None or table is None:
        raise TransferCheckError(f"slab {number}: region {slab.src_region!r} or table "
                                 f"{slab.src_table!r} is not the source rank's")
    if slab.length > slab.block_stride:
        raise TransferCheckError(f"slab {number}: {slab.length} bytes, more than its block "
                                 f"stride {slab.block_stride}: two blocks' slabs would meet")


def _gaps(number: int, slab: Slab, reads: list[Read]) -> list[Span]:
    """The slab's bytes (at block 0) no row reads; refused if two rows that may meet at one
    block id read one byte (rows of one link at other blocks of its period never do)."""
    gaps: list[Span] = []
    at = slab.offset
    active: list[Read] = []
    for read in sorted(reads):
        lo, hi, link, slot = read
        active = [other for other in active if other[1] > lo]
        for other in active:
            if other[2] != link or other[3] == slot:
                raise TransferCheckError(f"slab {number}: bytes {lo}..{min(hi, other[1])} "
                                         "are read by two rows (a staged byte is read once)")
        active.append(read)
        if lo > at:
            gaps.append((at, lo))
        at = max(at, hi)
    if at < slab.offset + slab.length:
        gaps.append((at, slab.offset + slab.length))
    return gaps


def _gaps_are_the_blocks(number: int, slab: Slab, gaps: list[Span], facts: RankFacts) -> None:
    """No layer of the region places a byte of another block id in the slab's gaps (block
    k's bytes of a field sit `k * block_stride` after block 0's)."""
    if not gaps:
        return
    stride = slab.block_stride
    blocks = facts.tables[slab.src_table].num_blocks
    for layer in facts.layers.values():
        for place in layer.fields:
            if place.region != slab.src_region:
                continue
            extent = ((layer.units_per_block - 1) * place.unit_stride
                      + (layer.heads - 1) * place.head_stride + place.size)
            for lo, hi in gaps:
                if place.block_stride != stride:
                    raise TransferCheckError(
                        f"slab {number}: bytes {lo}..{hi} are moved but no row reads them, "
                        f"and layer {layer.name!r} places {place.name!r} in the region with "
                        f"block stride {place.block_stride}, not {stride}: they may be "
                        "another block's")
                # the field's bytes of block `b + k`, seen from the slab of block `b`:
                # [base + k * stride, ... + extent), for ids b and b + k of the pools
                first = max(-((place.base + extent - lo - 1) // stride), 1 - blocks)
                last = min((hi - 1 - place.base) // stride,
                           facts.tables[layer.table].num_blocks - 1)
                if first <= last and (first, last) != (0, 0):
                    raise TransferCheckError(
                        f"slab {number}: bytes {lo}..{hi} (moved, read by no row) hold "
                        f"layer {layer.name!r}'s {place.name!r} of another block")


def _areas_apart(staged: StagedPattern) -> None:
    by_rank: dict[int, list[tuple[int, int, int]]] = {}
    for number, slab in enumerate(staged.slabs):
        end = slab.staging_offset + slab.length * slab.slots
        if slab.dst_rank >= len(staged.staging_bytes) or end > staged.staging_bytes[
                slab.dst_rank]:
            raise TransferCheckError(f"slab {number}: its staging area ends at byte {end}, "
                                     "past its destination rank's staging region")
        by_rank.setdefault(slab.dst_rank, []).append((slab.staging_offset, end, number))
    for rank, size in enumerate(staged.staging_bytes):
        end = max((area[1] for area in by_rank.get(rank, ())), default=0)
        if size != end:
            raise TransferCheckError(f"staging_bytes[{rank}]: {size}; its slabs' areas take "
                                     f"{end} (the region an executor allocates)")
    for areas in by_rank.values():
        areas.sort()
        for (_, end, first), (start, _, second) in pairwise(areas):
            if start < end:
                raise TransferCheckError(f"slabs {first} and {second}: their staging areas "
                                         "overlap (a staging byte would be written twice)")
