"""compile_transfer: the pattern two plans move for any request (see
docs/transfer.md#the-pattern). The same stages as build_transfer (match layers, map heads,
lower, coalesce), run over one period of each link with the block ids left as parameters:
each period piece lies in one block on each side, lowered at block 0, and a row never joins
rows of another piece, link or block stride (their block parameter differs)."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from math import lcm

from hisparse_plan.exchange.transfer.facts.rank_facts import FieldPlace
from hisparse_plan.exchange.transfer.facts.side import Instance, as_instance
from hisparse_plan.exchange.transfer.pattern.parts import PatternLink, PatternRow, PatternTable
from hisparse_plan.exchange.transfer.pattern.transfer_pattern import TransferPattern
from hisparse_plan.exchange.transfer.program.build import _ordinals, _regions
from hisparse_plan.exchange.transfer.program.coalesce import coalesce
from hisparse_plan.exchange.transfer.program.context_units import piece_groups
from hisparse_plan.exchange.transfer.program.lower import Row, lower_move
from hisparse_plan.exchange.transfer.program.match import LayerPair, match_layers
from hisparse_plan.exchange.transfer.program.serving import moves
from hisparse_plan.exchange.transfer.program.units import UnitGroup
from hisparse_plan.models.any_plan import Plan

Piece = tuple[int, int, int, int, int, int]
"""(first unit, stop, source slot, its unit in the block, destination slot, its unit)."""
TAG = "\x00"
"""Joins a region's name to a row's block parameter while rows are coalesced."""


def link_of(pair: LayerPair) -> PatternLink:
    """The layer's link: its tables and the rule that picks a request's units."""
    src, dst = pair.source, pair.destination
    state = src.kind == "state"
    src_units, dst_units = (1, 1) if state else (src.units_per_block, dst.units_per_block)
    return PatternLink(
        source_table=src.table, destination_table=dst.table, kind=src.kind,
        source_units=src_units, destination_units=dst_units,
        period=lcm(src_units, dst_units), tokens_per_unit=src.tokens_per_unit,
        window=pair.window if src.kind == "tokens" else None,
        chunk=(src.chunk if src.chunk is not None else dst.chunk)
        if src.kind == "tokens" else None,
    )


def period_pieces(link: PatternLink) -> list[Piece]:
    """The period cut wherever a block ends on either side."""
    period, src_units, dst_units = link.period, link.source_units, link.destination_units
    cuts = sorted({*range(0, period, src_units), *range(0, period, dst_units), period})
    return [(lo, hi, lo // src_units, lo % src_units, lo // dst_units, lo % dst_units)
            for lo, hi in pairwise(cuts)]


def compile_transfer(
    source: Instance | Plan | Sequence[Plan], destination: Instance | Plan | Sequence[Plan],
) -> TransferPattern:
    """The pattern that moves any request's KV from `source` to `destination`, or
    TransferRefused (a PlanError) naming the first layer and field that cannot move."""
    src, dst = as_instance(source), as_instance(destination)
    pairs = match_layers(src, dst)
    links: list[PatternLink] = []
    rows: list[Row] = []
    for ordinal, pair in zip(_ordinals(pairs), pairs, strict=True):
        link = link_of(pair)
        if link not in links:
            links.append(link)
        index = links.index(link)
        for dst_rank in dst.group(pair.name):
            rows.extend(_layer_rows(pair, ordinal, index, link, src, dst, dst_rank))
    tables = {pair.name: (pair.source.table, pair.destination.table) for pair in pairs}
    return TransferPattern(
        source=_regions(src), destination=_regions(dst),
        source_tables=_tables(src), destination_tables=_tables(dst),
        shared=[*_shared("source", src, pairs), *_shared("destination", dst, pairs)],
        layers=[pair.name for pair in pairs], links=links,
        rows=[_untagged(row, links) for row in coalesce(rows, tables)],
    )


def _layer_rows(pair: LayerPair, ordinal: int, index: int, link: PatternLink, src: Instance,
                dst: Instance, dst_rank: int) -> list[Row]:
    """One destination rank's rows of one layer over one period of its link, each tagged
    with its piece and block strides."""
    rows: list[Row] = []
    layer = dst.facts[dst_rank].layers[pair.name]
    for move in moves(pair, src, dst, dst_rank):
        for segment in move.segments:
            for number, piece in enumerate(period_pieces(link)):
                lo, hi, _, src_n, _, dst_n = piece
                # A DCP rank: its own runs of the piece, at its own positions.
                groups = [UnitGroup(lo, hi - lo, 1, 0, src_n, 0, 0, 0, dst_n, 0, 0)] \
                    if layer.shard is None else piece_groups(
                        lo, hi, layer.shard, (0, src_n), (0, 0), layer.local_units)
                tag = f"{TAG}{index}{TAG}{number}"
                rows.extend(
                    row._replace(src_region=_tag(row.src_region, tag, segment[2]),
                                 dst_region=_tag(row.dst_region, tag, segment[4]))
                    for group in groups
                    for row in lower_move((pair.name, ordinal), (move.src_rank, dst_rank),
                                          move.heads, move.head_starts, segment, group))
    return rows


def _tag(region: str, tag: str, place: FieldPlace) -> str:
    return f"{region}{tag}{TAG}{place.block_stride}"


def _untagged(row: Row, links: list[PatternLink]) -> PatternRow:
    src_region, link, number, src_stride = row.src_region.split(TAG)
    dst_region, _, _, dst_stride = row.dst_region.split(TAG)
    lo, hi, src_slot, _, dst_slot, _ = period_pieces(links[int(link)])[int(number)]
    return PatternRow.model_construct(
        link=int(link), unit_start=lo, unit_stop=hi, src_rank=row.src_rank,
        src_region=src_region, src_offset=row.src_offset, src_block_stride=int(src_stride),
        src_slot=src_slot, length=row.length, count=row.chunks, src_stride=row.src_stride,
        dst_rank=row.dst_rank, dst_region=dst_region, dst_offset=row.dst_offset,
        dst_block_stride=int(dst_stride), dst_slot=dst_slot, dst_stride=row.dst_stride,
        layer=row.layer,
    )


def _tables(side: Instance) -> list[PatternTable]:
    return [PatternTable(name=t.key, block_tokens=t.block_tokens, num_blocks=t.num_blocks,
                         padding_blocks=t.padding_blocks, state=t.state)
            for t in side.tables.values()]


def _shared(side: str, instance: Instance, pairs: list[LayerPair]) -> list[tuple[str, str, str]]:
    """Pairs of the side's tables whose moved layers share a region."""
    regions: dict[str, set[str]] = {}
    for pair in pairs:
        layer = pair.source if side == "source" else pair.destination
        regions.setdefault(layer.table, set()).update(f.region for f in layer.fields)
    names = sorted(regions)
    return [(side, a, b) for i, a in enumerate(names) for b in names[i + 1:]
            if regions[a] & regions[b]]
