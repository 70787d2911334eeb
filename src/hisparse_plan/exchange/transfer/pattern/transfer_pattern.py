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

from hisparse_plan.exchange.transfer.pattern.parts import (
    PatternLink,
    PatternRow,
    PatternTable,
    SharedTables,
)
from hisparse_plan.exchange.transfer.program.transfer_program import RankRegions, TransferRequest
from hisparse_plan.models.base import READ_ONLY, Model

if TYPE_CHECKING:
    from hisparse_plan.exchange.transfer.pattern.instance import Instantiated, PatternArrays

PATTERN_VERSION: Final = 1


class TransferPattern(Model):
    """Every row two plans move for a request, block ids as parameters (module doc)."""

    pattern_version: Literal[1] = PATTERN_VERSION
    source: Annotated[list[RankRegions], Field(min_length=1), READ_ONLY]
    destination: Annotated[list[RankRegions], Field(min_length=1), READ_ONLY]
    source_tables: Annotated[list[PatternTable], READ_ONLY]
    destination_tables: Annotated[list[PatternTable], READ_ONLY]
    shared: Annotated[list[SharedTables], READ_ONLY] = Field(
        description="(side, table, table): two tables of one side whose layers share a "
        "region (vLLM's groups over one pool), so a request gives them other blocks.")
    layers: Annotated[list[str], READ_ONLY]
    links: Annotated[list[PatternLink], READ_ONLY]
    rows: Annotated[list[PatternRow], READ_ONLY]

    @cached_property
    def arrays(self) -> PatternArrays:
        """The rows as numpy columns per link (made once, on the first request)."""
        from hisparse_plan.exchange.transfer.pattern.instance import pattern_arrays

        return pattern_arrays(self)

    def instantiate(self, request: TransferRequest) -> Instantiated:
        """One request's rows as block ids per row of the pattern: its blocks checked (each
        table given, enough ids, each a block of the pool and not the null block, none twice,
        none shared by two tables of one pool), or TransferRefused naming the table."""
        from hisparse_plan.exchange.transfer.pattern.instance import instantiate

        return instantiate(self, request)

    @property
    def chunks_per_period(self) -> dict[int, int]:
        """Link -> chunks its rows move per period (what an engine without strided copies
        posts per period)."""
        found: dict[int, int] = {}
        for row in self.rows:
            found[row.link] = found.get(row.link, 0) + row.count
        return found
