"""The rows of a pattern proved once for every block id and every period (see
docs/transfer.md#what-is-proved-once-what-per-request), with check_transfer's own decoding.

Each row is read at block id 0 on both sides, the block at the row's slot of the period
being the only block of its table (every other id is no block of the request), so that
check_transfer's reading proves every byte of every chunk lies in that one block of the
row's table, and both sides move the same logical (layer, unit, head, byte) in the same
order. Each tensor the row's bytes run through places block `b`'s byte at its block-0 byte
plus `b` times its block stride; the row's own block stride must be that stride, so the row
at any id `b` moves the same logical bytes of block `b` (the plans place each logical byte
at one address), and its units are those of its position: shifted by a whole period, which
both sides share. Every id up to the table's last keeps the row inside its region (checked
at the last id: the offsets are affine in the id). Then, per destination rank and layer,
the boxes the rows write over one period share no byte and tile the period's units, heads
and row bytes exactly, each row's boxes within its own units `[unit_start, unit_stop)`, and
each written layer's rule is its row's link. No request and no pool size enters: the cost
grows with rows per period.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from math import lcm

from hisparse_plan.checking import check_plan
from hisparse_plan.exchange.transfer.errors import TransferCheckError
from hisparse_plan.exchange.transfer.facts.side import Instance
from hisparse_plan.exchange.transfer.pattern.parts import PatternLink, PatternRow, PatternTable
from hisparse_plan.exchange.transfer.program.match import LayerPair
from hisparse_plan.exchange.transfer.program.transfer_program import RankRegions, TransferRow
from hisparse_plan.exchange.transfer.proof.check import (
    complete,
    rank_patterns,
    rank_side,
    row_readings,
)
from hisparse_plan.exchange.transfer.proof.check_boxes import Written
from hisparse_plan.exchange.transfer.proof.check_context import rank_frame
from hisparse_plan.exchange.transfer.proof.check_places import region_sizes
from hisparse_plan.exchange.transfer.proof.check_row import Reading, Side
from hisparse_plan.exchange.transfer.proof.check_walk import Positions


def prove_period(rows: Sequence[PatternRow], links: Sequence[PatternLink],
                 tables: tuple[Sequence[PatternTable], Sequence[PatternTable]],
                 regions: tuple[Sequence[RankRegions], Sequence[RankRegions]],
                 pairs: list[LayerPair], src: Instance, dst: Instance) -> int:
    """Prove the rows (module doc); returns the boxes proved, or raises TransferCheckError
    naming the first row at fault."""
    for plan in {id(plan): plan for plan in (*src.plans, *dst.plans)}.values():
        check_plan(plan)  # every logical byte at one address: decoding is unambiguous
    sides = (_sides(src, pairs), _sides(dst, pairs))
    _listed_regions(regions, src, dst)
    blocks = tuple({table.name: table.num_blocks for table in listed} for listed in tables)
    rules = {pair.name: layer_rule(pair) for pair in pairs}
    frames = [rank_frame({name: layer.shard for name, layer in facts.layers.items()
                          if layer.shard is not None}) for facts in dst.facts]
    written: dict[tuple[int, str], list[Written]] = {}
    cache: dict[tuple[int, int, str, int], dict[str, Positions]] = {}
    for index, row in enumerate(rows):
        link = links[row.link]
        ranks = (row.src_rank, row.dst_rank)
        for what, number, side in (("source", 0, sides[0]), ("destination", 1, sides[1])):
            if ranks[number] >= len(side):
                raise TransferCheckError(f"row {index}: {what} rank {ranks[number]} does not "
                                         f"exist ({len(side)} ranks)", row=index)
        at = []
        for number, (table, slot) in enumerate(((link.source_table, row.src_slot),
                                                (link.destination_table, row.dst_slot))):
            side = list(sides[number])
            key = (number, ranks[number], table, slot)
            if key not in cache:
                cache[key] = _only_block_zero(side[ranks[number]], table, slot)
            side[ranks[number]] = replace(side[ranks[number]], positions=cache[key])
            at.append(side)
        readings = row_readings(index, _at_block_zero(row), at[0], at[1],
                                frames[row.dst_rank])
        for source, destination in readings:
            _block_arithmetic(index, row, link, source, destination, blocks)
            for box in destination.boxes:
                start, stop = _held(dst, row, destination.pattern.layers[box.layers[0]])
                if not start <= box.units[0] < box.units[1] <= stop:
                    raise TransferCheckError(
                        f"row {index}: it writes units {box.units[0]}..{box.units[1] - 1} of "
                        f"the period; its units are {start}..{stop - 1}", row=index)
                for layer in destination.pattern.layers[box.layers[0]:box.layers[1]]:
                    if rules.get(layer) != link:
                        raise TransferCheckError(f"row {index}: it writes layer {layer!r}, "
                                                 "whose rule is not its link's", row=index,
                                                 layer=layer)
                    written.setdefault((row.dst_rank, layer), []).append(
                        Written(box.units, box.heads, box.row, index))
        _inside_at_every_id(index, row, link, blocks, (at[0][row.src_rank],
                                                       at[1][row.dst_rank]))
    for pair in pairs:
        period = rules[pair.name].period
        for rank in dst.group(pair.name):
            complete(pair, rank, dst, written.get((rank, pair.name), []), (0, period))
    return sum(len(boxes) for boxes in written.values())


def _held(dst: Instance, row: PatternRow, layer: str) -> tuple[int, int]:
    """The row's units of the period as the destination rank holds them: the same units, or
    on a DCP rank its own positions of them (the readings are in those)."""
    facts = dst.facts[row.dst_rank].layers.get(layer)
    shard = None if facts is None else facts.shard
    if shard is None:
        return row.unit_start, row.unit_stop
    return shard.held(row.unit_start), shard.held(row.unit_stop)


def layer_rule(pair: LayerPair) -> PatternLink:
    """The rule the plans give a layer, read here from the pair's facts (not the
    compiler's)."""
    src, dst = pair.source, pair.destination
    units = (1, 1) if src.kind == "state" else (src.units_per_block, dst.units_per_block)
    tokens = src.kind == "tokens"
    chunk = src.chunk if src.chunk is not None else dst.chunk
    return PatternLink(source_table=src.table, destination_table=dst.table, kind=src.kind,
                       source_units=units[0], destination_units=units[1],
                       period=lcm(*units), tokens_per_unit=src.tokens_per_unit,
                       window=pair.window if tokens else None, chunk=chunk if tokens else None)


def _sides(side: Instance, pairs: list[LayerPair]) -> list[Side]:
    return [rank_side(plan, found, {})
            for plan, found in zip(side.plans, rank_patterns(side, pairs), strict=True)]


def _listed_regions(regions: tuple[Sequence[RankRegions], Sequence[RankRegions]],
                    src: Instance, dst: Instance) -> None:
    """The pattern lists each rank's regions as its plan has them (an executor registers and
    sizes what it lists)."""
    for what, listed, plans in (("source", regions[0], src.plans),
                                ("destination", regions[1], dst.plans)):
        if len(listed) != len(plans):
            raise TransferCheckError(f"the pattern's {what} has {len(listed)} ranks; the "
                                     f"plans have {len(plans)}")
        for rank, (given, plan) in enumerate(zip(listed, plans, strict=True)):
            theirs = {(r.name, r.size, r.location) for r in given.regions}
            if given.rank != rank or theirs != set(region_sizes(plan)) \
                    or len(given.regions) != len(theirs):
                raise TransferCheckError(f"the pattern's {what} rank {rank} lists other "
                                         "regions than its plan")


def _only_block_zero(side: Side, table: str, slot: int) -> dict[str, Positions]:
    """Positions where block id 0 is the request's block at `slot` of the row's table and
    no other id of any table is the request's (negative ids are no block)."""
    empty = Positions.of([], 0)
    found = {name: empty for name in {p.table for placed in side.patterns.values()
                                      for p in placed}}
    found[table] = Positions.of([-1 - at for at in range(slot)] + [0], 0)
    return found


def _at_block_zero(row: PatternRow) -> TransferRow:
    return TransferRow.model_construct(
        src_rank=row.src_rank, src_region=row.src_region, src_offset=row.src_offset,
        length=row.length, count=row.count, src_stride=row.src_stride, dst_rank=row.dst_rank,
        dst_region=row.dst_region, dst_offset=row.dst_offset, dst_stride=row.dst_stride,
        layer=row.layer)


def _block_arithmetic(index: int, row: PatternRow, link: PatternLink, source: Reading,
                      destination: Reading, blocks: tuple[dict[str, int], ...]) -> None:
    """Each tensor the row runs through is its link's table's, with the row's block stride,
    and holds every block id of the table."""
    for what, reading, table, stride, known in (
            ("source", source, link.source_table, row.src_block_stride, blocks[0]),
            ("destination", destination, link.destination_table, row.dst_block_stride,
             blocks[1])):
        layout = reading.pattern
        if layout.table != table:
            raise TransferCheckError(f"row {index} ({what}): its bytes are table "
                                     f"{layout.table!r}'s; its link gives it the ids of "
                                     f"{table!r}", row=index, layer=row.layer)
        axis = layout.axis("block")
        if axis is None or axis.stride != stride:
            raise TransferCheckError(
                f"row {index} ({what}): block stride {stride}; the plan places block b of "
                f"its bytes {None if axis is None else axis.stride} bytes a block apart",
                row=index, layer=row.layer)
        if axis.extent < known.get(table, 0):
            raise TransferCheckError(f"row {index} ({what}): its tensor holds {axis.extent} "
                                     f"blocks; table {table!r} gives ids up to "
                                     f"{known.get(table, 0) - 1}", row=index, layer=row.layer)


def _inside_at_every_id(index: int, row: PatternRow, link: PatternLink,
                        blocks: tuple[dict[str, int], ...], sides: tuple[Side, Side]) -> None:
    """The row inside its region at the table's last id (so at every id: affine in it)."""
    for what, offset, stride, chunk_stride, table, known, side, region in (
            ("source", row.src_offset, row.src_block_stride, row.src_stride,
             link.source_table, blocks[0], sides[0], row.src_region),
            ("destination", row.dst_offset, row.dst_block_stride, row.dst_stride,
             link.destination_table, blocks[1], sides[1], row.dst_region)):
        last = max(known.get(table, 1) - 1, 0)
        step = chunk_stride if row.count > 1 else row.length
        end = offset + last * stride + (row.count - 1) * step + row.length
        size = side.sizes.get(region, 0)
        if end > size:
            raise TransferCheckError(f"row {index}: at block {last} its {what} bytes end at "
                                     f"{end}, past region {region!r} of {size} bytes",
                                     row=index)
