"""The JSON parts of a pattern and a staged pattern: block tables, links, rows and slabs (see
transfer_pattern and staging for what they mean). Both the patterns and their per-request
instantiations read these; neither pattern module is imported here."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, Field

from hisparse_plan.exchange.transfer.program.transfer_program import Rank
from hisparse_plan.models.base import ByteCount, Model, PositiveInt

Count = Annotated[int, Field(ge=0, le=2**62)]


def _array_as_tuple(value: object) -> object:
    """A JSON array read back as the tuple it was dumped from (the models are strict, and
    JSON text is read as Python lists first)."""
    return tuple(value) if type(value) is list else value


SharedTables = Annotated[tuple[str, str, str], BeforeValidator(_array_as_tuple)]
"""(side, table, table): two tables of one side whose layers share a region."""


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
    length: PositiveInt
    count: PositiveInt
    src_rank: Rank
    src_region: str
    src_offset: ByteCount
    src_block_stride: ByteCount
    src_slot: Count
    src_stride: ByteCount
    dst_rank: Rank
    dst_region: str
    dst_offset: ByteCount
    dst_block_stride: ByteCount
    dst_slot: Count
    dst_stride: ByteCount
    layer: str


class Slab(Model):
    """One slab class: a byte range of every block of one source table (module doc), staged
    on one destination rank at `staging_offset`, `slots` blocks at a time."""

    src_rank: int = Field(ge=0)
    src_table: str
    src_region: str
    block_stride: PositiveInt
    offset: ByteCount
    length: PositiveInt
    dst_rank: int = Field(ge=0)
    staging_offset: ByteCount
    slots: PositiveInt
