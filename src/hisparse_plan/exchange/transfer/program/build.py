"""Build a transfer program: match layers -> map tokens and heads to logical moves -> lower to
byte rows -> coalesce (see docs/transfer.md). Each stage hands a finished value to the next."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from hisparse_plan.exchange.transfer.facts.context import ContextShard
from hisparse_plan.exchange.transfer.facts.rank_facts import TableFacts
from hisparse_plan.exchange.transfer.facts.side import Instance, as_instance
from hisparse_plan.exchange.transfer.program.coalesce import coalesce
from hisparse_plan.exchange.transfer.program.context_units import shard_groups
from hisparse_plan.exchange.transfer.program.lower import Row, lower_move
from hisparse_plan.exchange.transfer.program.match import LayerPair, match_layers
from hisparse_plan.exchange.transfer.program.serving import moves
from hisparse_plan.exchange.transfer.program.transfer_program import (
    RankRegions,
    Region,
    TransferProgram,
    TransferRequest,
    TransferRow,
)
from hisparse_plan.exchange.transfer.program.units import (
    UnitGroup,
    needed_units,
    no_block_twice,
    table_blocks,
    unit_groups,
)
from hisparse_plan.models.any_plan import Plan


def build_transfer(
    source: Instance | Plan | Sequence[Plan],
    destination: Instance | Plan | Sequence[Plan],
    request: TransferRequest,
) -> TransferProgram:
    """The rows that move `request`'s KV from `source` to `destination`, or TransferRefused
    (a PlanError) naming the first layer and field that cannot move as bytes."""
    src, dst = as_instance(source), as_instance(destination)
    pairs = match_layers(src, dst)
    rows: list[Row] = []
    groups_cache: GroupCache = {}
    used: tuple[Used, Used] = (Used(), Used())
    for ordinal, pair in zip(_ordinals(pairs), pairs, strict=True):
        for dst_rank in dst.group(pair.name):
            shard = dst.facts[dst_rank].layers[pair.name].shard
            groups = _groups(pair, request, src.tables, dst.tables, groups_cache, used, shard)
            rows.extend(_layer_rows(pair, ordinal, src, dst, dst_rank, groups))
    no_block_twice("source", used[0].blocks, used[0].regions)
    no_block_twice("destination", used[1].blocks, used[1].regions)
    return TransferProgram(
        request=request,
        source=_regions(src),
        destination=_regions(dst),
        layers=[pair.name for pair in pairs],
        rows=[_row(row) for row in coalesce(rows, {
            pair.name: (pair.source.table, pair.destination.table) for pair in pairs})],
    )


@dataclass
class Used:
    """Block ids and regions each table of one side takes."""

    blocks: dict[str, set[int]] = field(default_factory=dict)
    regions: dict[str, set[str]] = field(default_factory=dict)


def _ordinals(pairs: list[LayerPair]) -> list[int]:
    """Each layer's place on the logical layer axis: consecutive where the layers follow one
    another in one tensor on both sides (a row may step from one to the next), two apart
    where either side changes tensor (a row never steps across)."""
    ordinals: list[int] = []
    for index, pair in enumerate(pairs):
        if not ordinals:
            ordinals.append(0)
            continue
        before = pairs[index - 1]
        same = (before.source.tensor, before.destination.tensor) == (
            pair.source.tensor, pair.destination.tensor)
        ordinals.append(ordinals[-1] + (1 if same else 2))
    return ordinals


GroupCache = dict[tuple[str, str, int, int, ContextShard | None], list[UnitGroup]]


def _groups(
    pair: LayerPair, request: TransferRequest, src: Mapping[str, TableFacts],
    dst: Mapping[str, TableFacts], cache: GroupCache, used: tuple[Used, Used],
    shard: ContextShard | None,
) -> list[UnitGroup]:
    """The layer's units as runs on both sides' blocks (shared by the layers of one pair of
    tables); a DCP destination rank's own units only, at its own positions."""
    first, stop = needed_units(pair, request.num_tokens)
    key = (pair.source.table, pair.destination.table, first, stop, shard)
    if key not in cache:
        src_units, dst_units = pair.source.units_per_block, pair.destination.units_per_block
        src_ids = table_blocks("source", src[pair.source.table],
                               request.source_blocks, pair.name, first, stop, src_units)
        dst_ids = table_blocks("destination", dst[pair.destination.table],
                               request.destination_blocks, pair.name, first, stop, dst_units)
        cache[key] = unit_groups(first, stop, src_ids, src_units, dst_ids, dst_units) \
            if shard is None else shard_groups(first, stop, src_ids, src_units, dst_ids,
                                               dst_units, shard)
        for side, layer, ids in ((used[0], pair.source, src_ids),
                                 (used[1], pair.destination, dst_ids)):
            side.blocks.setdefault(layer.table, set()).update(
                ids[first // layer.units_per_block:])
    for side, layer in ((used[0], pair.source), (used[1], pair.destination)):
        side.regions.setdefault(layer.table, set()).update(f.region for f in layer.fields)
    return cache[key]


def _layer_rows(
    pair: LayerPair, ordinal: int, src: Instance, dst: Instance, dst_rank: int,
    groups: list[UnitGroup],
) -> list[Row]:
    """One destination rank's rows of one layer: its heads (or a state's pieces) from the
    ranks that hold them."""
    rows: list[Row] = []
    for move in moves(pair, src, dst, dst_rank):
        for segment in move.segments:
            for group in groups:
                rows.extend(lower_move((pair.name, ordinal), (move.src_rank, dst_rank),
                                       move.heads, move.head_starts, segment, group))
    return rows


def _regions(side: Instance) -> list[RankRegions]:
    return [
        RankRegions(
            rank=rank, engine=side.engine,  # type: ignore[arg-type]
            regions=[Region(name=r.name, pool=r.pool, layer=r.layer, location=r.location,
                            size=r.size) for r in facts.regions.values()],
        )
        for rank, facts in enumerate(side.facts)
    ]


def _row(row: Row) -> TransferRow:
    return TransferRow.model_construct(
        src_rank=row.src_rank, src_region=row.src_region, src_offset=row.src_offset,
        length=row.length, count=row.chunks, src_stride=row.src_stride, dst_rank=row.dst_rank,
        dst_region=row.dst_region, dst_offset=row.dst_offset, dst_stride=row.dst_stride,
        layer=row.layer,
    )
