"""Which source ranks serve one destination rank's part of a layer, and which segments of the
logical row each moves: heads from the ranks that hold them (heads.py), or a state's pieces
between TP sizes from the ranks whose pieces overlap (states.py). build_transfer and
compile_transfer lower the same moves."""

from __future__ import annotations

from typing import NamedTuple

from hisparse_plan.exchange.transfer.facts.heads import head_start, serving_ranks
from hisparse_plan.exchange.transfer.facts.rank_facts import FieldPlace
from hisparse_plan.exchange.transfer.facts.side import Instance
from hisparse_plan.exchange.transfer.facts.states import sliced
from hisparse_plan.exchange.transfer.program.match import LayerPair, segments

Segment = tuple[int, int, FieldPlace, int, FieldPlace, int]


class Move(NamedTuple):
    """Global heads `heads` of the layer from `src_rank`, whose first heads on each side are
    `head_starts`, as `segments` of the logical row."""

    src_rank: int
    heads: tuple[int, int]
    head_starts: tuple[int, int]
    segments: list[Segment]


def moves(pair: LayerPair, src: Instance, dst: Instance, dst_rank: int) -> list[Move]:
    """What destination rank `dst_rank` receives of the layer, source rank by source rank
    (the ranks of the layer's pipeline stage on each side, in their tensor-parallel order)."""
    layer = dst.facts[dst_rank].layers[pair.name]
    src_group = src.group(pair.name)
    if pair.states is not None:
        place, _ = dst.tp_rank(pair.name, dst_rank)
        mine = sliced(layer, pair.states, place, len(dst.group(pair.name)))
        found = []
        taken: set[tuple[int, int]] = set()
        # Source ranks from the destination's place on: a state the same on every rank is
        # read from one of them, the destination ranks taking turns.
        for turn in range(len(src_group)):
            index = (place + turn) % len(src_group)
            theirs = sliced(src.facts[src_group[index]].layers[pair.name], pair.states, index,
                            len(src_group))
            shared = [segment for segment in segments(theirs, mine)
                      if segment[:2] not in taken]
            taken.update(segment[:2] for segment in shared)
            if shared:
                found.append(Move(src_group[index], (0, 1), (0, 0), shared))
        return found
    place, size = dst.tp_rank(pair.name, dst_rank)
    first = head_start(layer, place, size, dst.total_kv_heads)
    src_starts = [head_start(src.facts[rank].layers[pair.name], index, len(src_group),
                             src.total_kv_heads) for index, rank in enumerate(src_group)]
    served = serving_ranks(src_starts, pair.source.heads, (first, first + layer.heads), place)
    return [Move(src_group[index], (head, stop), (src_starts[index], first),
                 segments(src.facts[src_group[index]].layers[pair.name], layer))
            for index, head, stop in served]
