"""The transfer pattern: what two plans move for any request, with the request's block ids
as parameters, as JSON (see docs/transfer.md#the-pattern).

A *link* is a pair of block tables (one per side) and the rule that says which of a
request's units a layer moves (every token, a window, a chunk, index pages, a Mamba state).
Its units repeat with a *period*: the least common multiple of the sides' units per block,
so that a period starts a block on both sides. A pattern row moves part of one period: the
units `[unit_start, unit_stop)` of it, all in block `src_slot` of the period on the source and
`dst_slot` on the destination. For a request, the row at period `p` is a TransferRow whose
offsets are `src_offset + id * src_block_stride` (and the destination's alike), `id` being
the request's block at position `p * (period / units per block) + slot` of the table.

`compile_transfer` builds a pattern, `check_pattern` proves it for every request the plans
admit, `TransferPattern.instantiate` turns one request into what an executor posts (numpy:
imported when a request is instantiated, never by the package).
"""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING, Annotated, Final, Literal

from pydantic import Field

from hisparse_plan.exchange.transfer.program import Rank, RankRegions, TransferRequest
from hisparse_plan.models.base import READ_ONLY, ByteCount, Model, PositiveInt

if TYPE_CHECKING:
    from hisparse_plan.exchange.transfer.instance import Instantiated, PatternArrays

PATTERN_VERSION: Final = 1
Count = Annotated[int, Field(ge=0, le=2**62)]


class PatternTable(Model):
    """One block table of one side, as a request gives its blocks."""

    name: str = Field(min_length=1)
    block_tokens: PositiveInt
    num_blocks: PositiveInt
    padding_blocks: Count = Field(description="Ids below it are no request's (null block).")
    state: bool = Field(description="A Mamba state table: the request's last block is moved.")


class PatternLink(Model):
    """A pair of tables and the rule that picks a request's units (see module doc)."""

    source_table: str
    destination_table: str
    kind: Literal["tokens", "pages", "state"]
    source_units: PositiveInt = Field(description="Units per source block.")
    destination_units: PositiveInt = Field(description="Units per destination block.")
    period: PositiveInt = Field(description="Units after which the rows repeat.")
    tokens_per_unit: Count = Field(description="1 for tokens, a page's tokens, 0 for a state.")
    window: PositiveInt | None = Field(description="A sliding window's tokens, or null.")
    chunk: PositiveInt | None = Field(description="A chunked-local layer's chunk, or null.")


class PatternRow(Model):
    """Part of one period of one link (see module doc); `count` chunks of `length` bytes,
    strides 0 when `count` is 1."""

    link: Count
    unit_start: Count
    unit_stop: PositiveInt
    src_rank: Rank
    src_region: str
    src_offset: ByteCount
    src_block_stride: ByteCount
    src_slot: Count
    length: PositiveInt
    count: PositiveInt
    src_stride: ByteCount
    dst_rank: Rank
    dst_region: str
    dst_offset: ByteCount
    dst_block_stride: ByteCount
    dst_slot: Count
    dst_stride: ByteCount
    layer: str


class TransferPattern(Model):
    """Every row two plans move for a request, block ids as parameters (module doc)."""

    pattern_version: Literal[1] = PATTERN_VERSION
    source: Annotated[list[RankRegions], Field(min_length=1), READ_ONLY]
    destination: Annotated[list[RankRegions], Field(min_length=1), READ_ONLY]
    source_tables: Annotated[list[PatternTable], READ_ONLY]
    destination_tables: Annotated[list[PatternTable], READ_ONLY]
    shared: Annotated[list[tuple[str, str, str]], READ_ONLY] = Field(
        description="(side, table, table): two tables of one side whose layers share a "
        "region (vLLM's groups over one pool), so a request gives them other blocks.")
    layers: Annotated[list[str], READ_ONLY]
    links: Annotated[list[PatternLink], READ_ONLY]
    rows: Annotated[list[PatternRow], READ_ONLY]

    @cached_property
    def arrays(self) -> PatternArrays:
        """The rows as numpy columns per link (made once, on the first request)."""
        from hisparse_plan.exchange.transfer.instance import pattern_arrays

        return pattern_arrays(self)

    def instantiate(self, request: TransferRequest) -> Instantiated:
        """One request's rows as block ids per row of the pattern: its blocks checked (each
        table given, enough ids, each a block of the pool and not the null block, none twice,
        none shared by two tables of one pool), or TransferRefused naming the table."""
        from hisparse_plan.exchange.transfer.instance import instantiate

        return instantiate(self, request)

    @property
    def chunks_per_period(self) -> dict[int, int]:
        """Link -> chunks its rows move per period (what an engine without strided copies
        posts per period)."""
        found: dict[int, int] = {}
        for row in self.rows:
            found[row.link] = found.get(row.link, 0) + row.count
        return found
