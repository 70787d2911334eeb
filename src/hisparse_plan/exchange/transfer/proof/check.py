"""check_transfer: prove a transfer program from the two instances' plans alone (see
docs/transfer.md#the-proof).

Proved, with arithmetic of its own (check_places, check_walk, check_boxes), never by running
the lowering again:
- every row lies inside its region, on ranks that exist;
- each row reads and writes the same logical bytes, (layer, unit, global head, row byte),
  in the same order, on blocks of the request at the right positions;
- on every destination rank, every layer's written boxes share no byte and cover everything
  the layer needs (the request's units, the rank's heads, the whole row).
Both plans are proved sound first (check_plan): each places a logical byte at one address
only, so no destination byte is written twice and no byte outside the request's destination
blocks is touched. The cost grows with rows (and the boxes they write), not with tokens or
bytes; a row whose chunks each span a run of blocks, the runs apart, costs one block lookup
per chunk.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import prod

from hisparse_plan.checking import check_plan
from hisparse_plan.exchange.transfer.errors import TransferCheckError
from hisparse_plan.exchange.transfer.facts.heads import head_start
from hisparse_plan.exchange.transfer.facts.side import Instance, as_instance
from hisparse_plan.exchange.transfer.facts.states import full_row, state_pieces
from hisparse_plan.exchange.transfer.program.match import LayerPair, match_layers
from hisparse_plan.exchange.transfer.program.transfer_program import TransferProgram, TransferRow
from hisparse_plan.exchange.transfer.program.units import ceil_div, needed_units, required_units
from hisparse_plan.exchange.transfer.proof.check_boxes import Written, covered, first_overlap
from hisparse_plan.exchange.transfer.proof.check_context import Frame, rank_frame
from hisparse_plan.exchange.transfer.proof.check_places import ByteLayout, patterns, region_sizes
from hisparse_plan.exchange.transfer.proof.check_row import Reading, Side, read, same
from hisparse_plan.exchange.transfer.proof.check_walk import Positions, contiguous
from hisparse_plan.models.any_plan import Plan


@dataclass(frozen=True, slots=True)
class TransferProof:
    """What check_transfer proved."""

    rows: int
    bytes: int
    layers: int
    boxes: int
    """Logical boxes the destination ranks' writes were proved disjoint and complete with."""


def check_transfer(
    program: TransferProgram,
    source: Instance | Plan | Sequence[Plan],
    destination: Instance | Plan | Sequence[Plan],
) -> TransferProof:
    """Prove `program` moves its request's KV from `source` to `destination` (module doc), or
    raise TransferCheckError naming the first row at fault."""
    src, dst = as_instance(source), as_instance(destination)
    for plan in {id(plan): plan for plan in (*src.plans, *dst.plans)}.values():
        check_plan(plan)  # every page of every plan its own bytes: decoding is unambiguous
    pairs = match_layers(src, dst)
    _same_ranks(program, src, dst)
    num_tokens = program.request.num_tokens
    src_sides = _sides(src, pairs, program.request.source_blocks, num_tokens, True)
    dst_sides = _sides(dst, pairs, program.request.destination_blocks, num_tokens, False)
    frames = [rank_frame({name: layer.shard for name, layer in facts.layers.items()
                          if layer.shard is not None}) for facts in dst.facts]
    written: dict[tuple[int, str], list[Written]] = {}
    boxes = 0
    for index, row in enumerate(program.rows):
        frame = frames[row.dst_rank] if row.dst_rank < len(frames) else None
        for reading in _row(index, row, src_sides, dst_sides, frame):
            for box in reading.boxes:
                for layer in reading.pattern.layers[box.layers[0]:box.layers[1]]:
                    written.setdefault((row.dst_rank, layer), []).append(
                        Written(box.units, box.heads, box.row, index))
                    boxes += 1
    for pair in pairs:
        for rank in dst.group(pair.name):
            _complete(pair, rank, dst, written.get((rank, pair.name), []), num_tokens)
    return TransferProof(len(program.rows), program.bytes, len(pairs), boxes)


def _same_ranks(program: TransferProgram, src: Instance, dst: Instance) -> None:
    """The program lists each rank's regions as its plan has them (an executor registers
    what the program lists)."""
    for what, ranks, side in (("source", program.source, src),
                              ("destination", program.destination, dst)):
        if len(ranks) != side.ranks:
            raise TransferCheckError(
                f"the program's {what} has {len(ranks)} ranks; the plans have {side.ranks}")
        for rank, (listed, plan) in enumerate(zip(ranks, side.plans, strict=True)):
            theirs = {(r.name, r.size, r.location) for r in listed.regions}
            ours = set(region_sizes(plan))
            if listed.rank != rank or theirs != ours:
                missing = sorted(ours ^ theirs)[0]
                raise TransferCheckError(
                    f"the program's {what} rank {rank} lists other regions than its plan "
                    f"(first: {missing[0]!r} of {missing[1]} bytes, {missing[2]})")


def _sides(side: Instance, pairs: list[LayerPair], given: dict[str, list[int]],
           num_tokens: int, is_source: bool) -> list[Side]:
    """Each rank's patterns, region sizes and the request's block positions per table."""
    wanted = {pair.name for pair in pairs}
    splits = {pair.name: pair.states for pair in pairs if pair.states is not None}
    found = []
    for rank, plan in enumerate(side.plans):
        def origin(name: str, rank: int = rank) -> int:
            if name in splits:
                return 0  # a state between TP sizes: its pieces of the full state
            return head_start(side.facts[rank].layers[name], *side.tp_rank(name, rank),
                              side.total_kv_heads)

        def pieces(name: str, index: int, shape: tuple[int, ...], size: int, rank: int = rank
                   ) -> tuple[list[tuple[int, int, int]], int]:
            split = splits.get(name)
            if split is None:
                return [(0, 0, size)], size
            return (state_pieces(shape, size // max(1, prod(shape)), split[index],
                                 *side.tp_rank(name, rank)), split[index].size)
        found.append(patterns(plan, wanted, origin, pieces))
    states = {p.table for rank in found for placed in rank.values() for p in placed if p.state}
    spans: dict[str, tuple[int, int]] = {}
    for pair in pairs:
        layer = pair.source if is_source else pair.destination
        first, stop = needed_units(pair, num_tokens)
        per_block = layer.units_per_block
        low, high = first // per_block, ceil_div(stop, per_block)
        known = spans.get(layer.table)
        spans[layer.table] = (low, high) if known is None else (
            min(known[0], low), max(known[1], high))
    positions: dict[str, Positions] = {}
    for table, (low, high) in spans.items():
        ids = list(given.get(table, ()))
        if table in states:
            ids, low, high = ids[-1:], 0, 1
        positions[table] = Positions.of(ids[:high], low)
    what = "source" if is_source else "destination"
    sides = []
    for plan, placed in zip(side.plans, found, strict=True):
        _tables_apart(placed, positions, what)
        sizes = {name: size for name, size, _ in region_sizes(plan)}
        sides.append(Side.of(placed, sizes, positions))
    return sides


def _tables_apart(found: dict[str, list[ByteLayout]], positions: dict[str, Positions],
                  side: str) -> None:
    """Tables placed in one region (vLLM's groups overlay a pool's blocks) were given
    different blocks: one block of two tables is the same bytes."""
    for region, placed in found.items():
        tables = sorted({pattern.table for pattern in placed})
        for index, first in enumerate(tables):
            for second in tables[index + 1:]:
                common = set(positions[first].position) & set(positions[second].position)
                if common:
                    raise TransferCheckError(
                        f"{side} block {min(common)} is given to tables {first!r} and "
                        f"{second!r}, which share region {region!r}: its bytes would be "
                        "written twice")


def _row(index: int, row: TransferRow, src_sides: list[Side], dst_sides: list[Side],
         frame: Frame | None) -> list[Reading]:
    """The row's readings: one, or one per piece where its chunks run through several
    tensors (a block-outermost slab: each tensor's layers are one piece). The source is read
    in the destination rank's units (`frame`: a DCP rank's own positions)."""
    src = _side(index, "source", src_sides, row.src_rank, row.src_region, row.src_offset,
                row.src_stride, row)
    dst = _side(index, "destination", dst_sides, row.dst_rank, row.dst_region, row.dst_offset,
                row.dst_stride, row)
    whole = [read(src, row.src_region, row.src_offset, row.length, row.count, row.src_stride,
                  row.layer, frame),
             read(dst, row.dst_region, row.dst_offset, row.length, row.count, row.dst_stride,
                  row.layer)]
    if isinstance(whole[0], Reading) and isinstance(whole[1], Reading):
        _same(index, row, whole[0], whole[1])
        return [whole[1]]
    cuts = sorted(set(_cuts(src, row.src_region, row.src_offset, row.length))
                  | set(_cuts(dst, row.dst_region, row.dst_offset, row.length)))
    if len(cuts) < 2:
        what, reason = next((w, r) for w, r in zip(("source", "destination"), whole,
                                                    strict=True) if isinstance(r, str))
        raise TransferCheckError(f"row {index} ({what}): {reason}", row=index,
                                 layer=row.layer)
    readings: list[Reading] = []
    start = 0
    for stop in cuts:
        pieces = [read(side, region, offset + start, stop - start, row.count, stride, "",
                       framed)
                  for side, region, offset, stride, framed in (
                      (src, row.src_region, row.src_offset, row.src_stride, frame),
                      (dst, row.dst_region, row.dst_offset, row.dst_stride, None))]
        ours, theirs = pieces
        for what, piece in (("source", ours), ("destination", theirs)):
            if isinstance(piece, str):
                raise TransferCheckError(f"row {index} ({what}, bytes {start}..{stop}): "
                                         f"{piece}", row=index, layer=row.layer)
        if isinstance(ours, Reading) and isinstance(theirs, Reading):
            _same(index, row, ours, theirs)
            readings.append(theirs)
        start = stop
    return readings


def _cuts(side: Side, region: str, offset: int, length: int) -> list[int]:
    """Where the chunk passes from one tensor's contiguous run to the next's (its end
    included); [] when a byte of it is no byte of a moved layer."""
    cuts: list[int] = []
    at = 0
    while at < length:
        found = side.find(region, "", offset + at)
        if found is None:
            return []
        _, levels, digits = found
        at = min(length, at + contiguous(levels, digits))
        cuts.append(at)
    return cuts


def _side(index: int, what: str, sides: list[Side], rank: int, region: str, offset: int,
          stride: int, row: TransferRow) -> Side:
    """The rank's side, with the row's bytes inside its region."""
    if rank >= len(sides):
        raise TransferCheckError(f"row {index}: {what} rank {rank} does not exist", row=index)
    side = sides[rank]
    size = side.sizes.get(region)
    if size is None:
        raise TransferCheckError(f"row {index}: {what} rank {rank} has no region {region!r}",
                                 row=index)
    end = offset + (row.count - 1) * stride + row.length
    if row.count > 1 and stride < row.length and what == "destination":
        raise TransferCheckError(f"row {index}: its destination chunks overlap (stride "
                                 f"{stride} < length {row.length})", row=index)
    if end > size:
        raise TransferCheckError(f"row {index}: its {what} bytes end at {end}, past region "
                                 f"{region!r} of {size} bytes", row=index)
    return side


def _same(index: int, row: TransferRow, source: Reading, destination: Reading) -> None:
    reason = same(source, destination)
    if reason is not None:
        raise TransferCheckError(f"row {index}: {reason}", row=index, layer=row.layer)


def _complete(pair: LayerPair, rank: int, dst: Instance, boxes: list[Written],
              num_tokens: int) -> None:
    """The rank's boxes of the layer share no byte and cover all it needs."""
    layer = dst.facts[rank].layers[pair.name]
    clash = first_overlap(boxes)
    if clash is not None:
        raise TransferCheckError(
            f"rows {clash[0].index} and {clash[1].index} both write layer {pair.name!r} "
            f"units {max(clash[0].units[0], clash[1].units[0])}.. on destination rank {rank}",
            row=clash[1].index, layer=pair.name)
    units = required_units(pair, num_tokens)
    if layer.shard is not None:  # a DCP rank: its own units of those the layer needs
        units = (layer.shard.held(units[0]), layer.shard.held(units[1]))
    if pair.states is not None:
        # The rank's pieces of the full state: boxes of its own bytes, none twice.
        heads, row = (0, 1), (0, full_row(pair.states))
    else:
        first = head_start(layer, *dst.tp_rank(pair.name, rank), dst.total_kv_heads)
        heads, row = (first, first + layer.heads), (0, layer.row_bytes)
    need = (units[1] - units[0]) * layer.heads * layer.row_bytes
    have = covered(boxes, units, heads, row)
    if have != need:
        raise TransferCheckError(
            f"layer {pair.name!r} on destination rank {rank}: the rows write {have} of the "
            f"{need} bytes it needs (units {units[0]}..{units[1] - 1}, heads "
            f"{heads[0]}..{heads[1] - 1})", layer=pair.name)
