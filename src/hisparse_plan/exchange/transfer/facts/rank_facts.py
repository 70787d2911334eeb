"""What one rank's plan says about each layer a transfer may move, in words both engines share
(see docs/transfer.md#what-is-moved).

A layer's *logical row* is what one (unit, head) holds: K then V for attention, the latent
row for MLA, the whole page for index keys, every state for Mamba. A *unit* is what the
request's units are counted in: a token for attention rows, a page of `tokens_per_unit` tokens
for index keys (their bytes are laid out per page), one state for Mamba. Each side keeps each
part ("field") of the row somewhere; `FieldPlace` says where.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hisparse_plan.exchange.transfer.facts.context import ContextShard

Kind = Literal["tokens", "pages", "state"]


@dataclass(frozen=True, slots=True)
class FieldPlace:
    """Byte `c` of the field, for (block `b`, unit `n` of the block, local head `h`), is byte
    `base + b * block_stride + n * unit_stride + h * head_stride + c` of `region`."""

    name: str
    """k, v, latent, index, state0, state1, ..."""
    lo: int
    """Where the field starts in the layer's logical row."""
    size: int
    dtype: str
    shape: tuple[int, ...]
    """A state's shape; () for rows."""
    region: str
    base: int
    block_stride: int
    unit_stride: int
    head_stride: int


@dataclass(frozen=True, slots=True)
class LayerFacts:
    """One layer on one rank, as a transfer sees it."""

    name: str
    table: str
    """The block table the layer's blocks are given by."""
    kind: Kind
    units_per_block: int
    tokens_per_unit: int
    """1 for tokens, the page's tokens for pages, 0 for a state."""
    heads: int
    """Heads this rank holds (1 for latent rows, pages and states)."""
    replicated: bool
    """Every rank holds the same rows (MLA, index keys): one source rank serves each
    destination rank."""
    fmt: str | None
    """The cache format where the plan names one (fp8_ds_mla); None when it does not."""
    fields: tuple[FieldPlace, ...]
    window: int | None = None
    """Tokens a sliding-window layer still attends to."""
    windowed: bool = False
    """A window layer (its window may be unknown to the plan: SGLang's swa pool)."""
    chunk: int | None = None
    """Tokens of a chunked-local layer's chunk."""
    unsupported: str | None = None
    """Why this layer cannot be moved at all (DeepSeek-V4 caches), or None."""
    tensor: int = -1
    """The plan's tensor that places the layer (its first field's): layers of one tensor are
    one layer axis, which a row may step along."""
    shard: ContextShard | None = None
    """Decode context parallelism: the units this rank holds of a DCP-sharded layer (its
    places are at the rank's own positions, `units_per_block / shard.size` a block), or None.
    `units_per_block` is then the request's: what one block id of the table stands for."""

    @property
    def local_units(self) -> int:
        """Units one block holds on this rank (the request's units per block / DCP size)."""
        return self.units_per_block // (1 if self.shard is None else self.shard.size)

    @property
    def row_bytes(self) -> int:
        return sum(field.size for field in self.fields)


@dataclass(frozen=True, slots=True)
class TableFacts:
    """One block table of one rank."""

    key: str
    block_tokens: int
    """Tokens per block (1 for a state table)."""
    num_blocks: int
    padding_blocks: int
    state: bool


@dataclass(frozen=True, slots=True)
class RegionFacts:
    name: str
    pool: str
    layer: str | None
    location: Literal["device", "host"]
    size: int


@dataclass(frozen=True, slots=True)
class RankFacts:
    """Everything a transfer reads from one rank's plan."""

    engine: Literal["vllm", "sglang"]
    layers: dict[str, LayerFacts]
    tables: dict[str, TableFacts]
    regions: dict[str, RegionFacts]
