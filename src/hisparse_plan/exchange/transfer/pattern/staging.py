"""A staged transfer: where a pattern's rows are too small to move at a link's speed, each
source block's bytes go as one slab into a staging region the destination rank registers,
and the destination then rearranges them locally (see docs/transfer.md#staged-transfers).

A *slab* is a byte range of one source block, the same for every block id of its table:
`[offset + id * block_stride, ... + length)` of the source rank's region. Each pattern row is
read from exactly one slab (its `slab`), and each slab serves one destination rank. Phase 1
copies the request's slabs of one slab class into consecutive *slots* of that class's area
of the destination's staging region (`staging_offset + slot * length`), in ascending block
id, so a run of consecutive ids is one contiguous copy on both sides wherever the slab is the
whole block; phase 2 runs the pattern's rows with their source translated into the slot:
`staging_offset + slot * length + (row.src_offset - offset)`. A request larger than the
area (`slots` per class) is moved in rounds. check_staged proves the slabs and areas once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Final, Literal

from pydantic import Field

from hisparse_plan.exchange.transfer.errors import TransferRefused
from hisparse_plan.exchange.transfer.pattern.parts import PatternRow, Slab
from hisparse_plan.exchange.transfer.pattern.transfer_pattern import TransferPattern
from hisparse_plan.exchange.transfer.program.transfer_program import TransferRequest
from hisparse_plan.models.base import READ_ONLY, ByteCount, Model

if TYPE_CHECKING:
    from hisparse_plan.exchange.transfer.pattern.staged_request import StagedRequest

STAGED_VERSION: Final = 1


class StagedPattern(Model):
    """A proved pattern moved in two phases (module doc)."""

    staged_version: Literal[1] = STAGED_VERSION
    pattern: TransferPattern
    slabs: Annotated[list[Slab], Field(min_length=1), READ_ONLY]
    row_slab: Annotated[list[Annotated[int, Field(ge=0)]], READ_ONLY] = Field(
        description="Per pattern row, the slab it reads.")
    staging_bytes: Annotated[list[ByteCount], READ_ONLY] = Field(
        description="Per destination rank, the staging region's size.")
    staging_location: Literal["device", "host"] = Field(
        description="Where each destination rank keeps its staging region: beside most of "
        "the bytes it rearranges into.")

    def instantiate(self, request: TransferRequest) -> StagedRequest:
        """The request's blocks checked as TransferPattern.instantiate checks them, then
        its slots and rounds (staged_request)."""
        from hisparse_plan.exchange.transfer.pattern.staged_request import instantiate_staged

        return instantiate_staged(self, request)


def row_key(pattern: TransferPattern, index: int) -> tuple[int, str, str, int, int]:
    """What the rows of one slab share: source rank, table, region, block stride, and the
    destination rank."""
    row = pattern.rows[index]
    table = pattern.links[row.link].source_table
    return row.src_rank, table, row.src_region, row.src_block_stride, row.dst_rank


def row_extent(pattern: TransferPattern, index: int) -> tuple[int, int]:
    """[first, end) of the row's source bytes at block id 0."""
    row = pattern.rows[index]
    return row.src_offset, row.src_offset + _width(row)


def compile_staged(pattern: TransferPattern, slots: int) -> StagedPattern:
    """The pattern's rows gathered into slabs: rows sharing a source block (row_key) are
    joined, in source order, while the slab they span stays within one block stride; each
    destination rank's staging holds `slots` blocks of each of its slabs. A row whose chunks
    span more than a block stride (a layer axis outside the blocks) is first cut into its
    chunks, one row each: the staged pattern carries the cut pattern, which check_staged
    proves again."""
    if slots < 1:
        raise TransferRefused(f"slots: expected at least 1 staged block per slab, got {slots}",
                              field="slots")
    pattern = _cut_wide_rows(pattern)
    order = sorted(range(len(pattern.rows)),
                   key=lambda i: (row_key(pattern, i), row_extent(pattern, i)))
    spans: list[tuple[tuple[int, str, str, int, int], int, int]] = []
    row_slab = [0] * len(pattern.rows)
    for index in order:
        key, (first, end) = row_key(pattern, index), row_extent(pattern, index)
        if spans and spans[-1][0] == key and max(end, spans[-1][2]) - spans[-1][1] <= key[3]:
            spans[-1] = (key, spans[-1][1], max(end, spans[-1][2]))
        else:
            spans.append((key, first, end))
        row_slab[index] = len(spans) - 1
    used: dict[int, int] = {}
    slabs = []
    for (src_rank, table, region, stride, dst_rank), first, end in spans:
        at = used.get(dst_rank, 0)
        slabs.append(Slab(src_rank=src_rank, src_table=table, src_region=region,
                          block_stride=stride, offset=first, length=end - first,
                          dst_rank=dst_rank, staging_offset=at, slots=slots))
        used[dst_rank] = at + (end - first) * slots
    ranks = len(pattern.destination)
    return StagedPattern(pattern=pattern, slabs=slabs, row_slab=row_slab,
                         staging_bytes=[used.get(rank, 0) for rank in range(ranks)],
                         staging_location=_location(pattern))


def _cut_wide_rows(pattern: TransferPattern) -> TransferPattern:
    """The pattern with each row wider than its source block stride cut into its chunks."""
    if all(_width(row) <= row.src_block_stride for row in pattern.rows):
        return pattern
    rows = []
    for row in pattern.rows:
        if _width(row) <= row.src_block_stride:
            rows.append(row)
            continue
        rows.extend(row.model_copy(update={
            "src_offset": row.src_offset + chunk * row.src_stride,
            "dst_offset": row.dst_offset + chunk * row.dst_stride,
            "count": 1, "src_stride": 0, "dst_stride": 0}) for chunk in range(row.count))
    fields = {name: getattr(pattern, name) for name in TransferPattern.model_fields}
    return TransferPattern.model_construct(**{**fields, "rows": rows})


def _width(row: PatternRow) -> int:
    stride = row.src_stride if row.count > 1 else row.length
    return (row.count - 1) * stride + row.length


def _location(pattern: TransferPattern) -> Literal["device", "host"]:
    """Where most of a period's bytes land (the rearrangement runs beside them)."""
    where = {(rank.rank, region.name): region.location
             for rank in pattern.destination for region in rank.regions}
    host = sum(row.length * row.count for row in pattern.rows
               if where[(row.dst_rank, row.dst_region)] == "host")
    total = sum(row.length * row.count for row in pattern.rows)
    return "host" if 2 * host > total else "device"


def slots_for(pattern: TransferPattern, staging_bytes: int) -> int:
    """The most blocks of every slab a staging region of `staging_bytes` per destination rank
    holds at once (at least 1)."""
    per_slot = compile_staged(pattern, 1).staging_bytes
    return max(1, staging_bytes // max(max(per_slot), 1))
