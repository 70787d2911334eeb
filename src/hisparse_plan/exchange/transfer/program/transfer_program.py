"""The transfer program: what a transfer engine posts to move one request's KV from one
instance to another, as JSON (see docs/transfer.md#the-program).

A row reads `count` chunks of `length` bytes, chunk `i` at `src_offset + i * src_stride` of the
source rank's region, and writes chunk `i` at `dst_offset + i * dst_stride` of the destination
rank's region. Regions are named per rank: a pool's one allocation (`device`, `host`,
`hisparse_host`), or one layer's allocation of an SGLang per-layer pool (`kv/<layer>`).
"""

from __future__ import annotations

from typing import Annotated, Final, Literal, Protocol

from pydantic import Field

from hisparse_plan.models.base import READ_ONLY, ByteCount, Model, PositiveInt
from hisparse_plan.models.json_model import JsonTextModel

PROGRAM_VERSION: Final = 1
STAGING_REGION: Final = "staging"
"""The region each destination rank registers for phase 1 of a staged transfer."""
BlockIds = Annotated[list[Annotated[int, Field(ge=0, le=2**62)]], READ_ONLY]
Rank = Annotated[int, Field(ge=0, le=2**20)]


class TransferRequest(JsonTextModel):
    """One request's blocks on each side: per block table (`tables()` names them), the block
    ids in token order, block `i` holding the table's tokens `[i * B, (i + 1) * B)`. A state
    table (Mamba) moves the state in its last block."""

    num_tokens: PositiveInt = Field(description="Tokens of the request whose KV moves.")
    source_blocks: dict[str, BlockIds] = Field(description="Table -> block ids, source side.")
    destination_blocks: dict[str, BlockIds] = Field(
        description="Table -> block ids, destination side."
    )


class Region(Model):
    """One allocation of one rank, to register with a transfer engine once."""

    name: str = Field(min_length=1, description="`pool` or `pool/layer` (per-layer pools).")
    pool: str = Field(min_length=1, description="The plan's pool.")
    layer: str | None = Field(description="The layer of a per-layer allocation; else null.")
    location: Literal["device", "host"]
    size: ByteCount


class RankRegions(Model):
    rank: Rank
    engine: Literal["vllm", "sglang"]
    regions: Annotated[list[Region], READ_ONLY]


class StridedChunks(Protocol):
    """A row of `count` chunks of `length` bytes, `src_stride` and `dst_stride` apart (a
    program's TransferRow, a pattern's PatternRow)."""

    @property
    def length(self) -> int: ...
    @property
    def count(self) -> int: ...
    @property
    def src_stride(self) -> int: ...
    @property
    def dst_stride(self) -> int: ...


def is_one_copy(row: StridedChunks) -> bool:
    """Whether a row's chunks follow one another on both sides (or it has one), so that it
    is one contiguous copy; the one place this is decided (the program's descriptor count,
    NIXL's descriptors and the cost model read it)."""
    return row.count == 1 or row.src_stride == row.length == row.dst_stride


def copies(row: StridedChunks) -> int:
    """Contiguous copies an engine without strided descriptors posts for a row."""
    return 1 if is_one_copy(row) else row.count


class TransferRow(Model):
    """`count` chunks of `length` bytes from the source rank's region to the destination
    rank's; a stride is 0 when `count` is 1. `layer` names the layer of the row's first byte
    (for readers; check_transfer decodes every row from the plans and never trusts it)."""

    src_rank: Rank
    src_region: str
    src_offset: ByteCount
    length: PositiveInt
    count: PositiveInt
    src_stride: ByteCount
    dst_rank: Rank
    dst_region: str
    dst_offset: ByteCount
    dst_stride: ByteCount
    layer: str

    @property
    def bytes(self) -> int:
        return self.length * self.count


class TransferProgram(JsonTextModel):
    """Every row that moves one request's KV between two instances, with the regions they
    address (see docs/transfer.md#the-program)."""

    program_version: Literal[1] = PROGRAM_VERSION
    request: TransferRequest
    source: Annotated[list[RankRegions], Field(min_length=1), READ_ONLY]
    destination: Annotated[list[RankRegions], Field(min_length=1), READ_ONLY]
    layers: Annotated[list[str], READ_ONLY] = Field(description="The layers moved, in order.")
    rows: Annotated[list[TransferRow], READ_ONLY]

    @property
    def bytes(self) -> int:
        """Bytes the program moves (each destination byte once)."""
        return sum(row.length * row.count for row in self.rows)

    @property
    def descriptors(self) -> int:
        """Contiguous copies: what an engine without strided descriptors posts (NIXL). A row
        whose chunks follow one another on both sides is one; any other row, its count."""
        return sum(copies(row) for row in self.rows)
