"""A source row read in a DCP destination rank's own units (see
docs/transfer.md#decode-context-parallelism): the rank holds runs of `interleave` of the
request's units, one `dcp * interleave` apart, one after another in its blocks. A source
chunk's units map to the rank's positions only where each of its boxes lies in one run the
rank holds; the row's chunks then step by whole periods (a period is `interleave` of the
rank's units) or stay in that run. The arithmetic is vLLM's slot mapping
(facts/context.py), applied to what the source's own decoding found."""

from __future__ import annotations

from collections.abc import Callable

from hisparse_plan.exchange.transfer.facts.byte_layout import ByteLayout
from hisparse_plan.exchange.transfer.facts.context import ContextShard
from hisparse_plan.exchange.transfer.proof.check_boxes import Box

Frame = Callable[[ByteLayout, list[Box], int, int], "tuple[list[Box], int] | str"]
"""(the source pattern, the first chunk's boxes, units one chunk moves, chunks) -> the same
in the destination rank's units, or why they are not its units."""


def rank_frame(shards: dict[str, ContextShard]) -> Frame:
    """The frame of a destination rank whose layers `shards` are DCP-sharded (by layer)."""
    def frame(pattern: ByteLayout, boxes: list[Box], unit_step: int, count: int
              ) -> tuple[list[Box], int] | str:
        shard = shards.get(pattern.layers[0])
        if shard is None:
            return boxes, unit_step
        return to_rank(shard, boxes, unit_step, count)
    return frame


def to_rank(shard: ContextShard, boxes: list[Box], unit_step: int, count: int
            ) -> tuple[list[Box], int] | str:
    """The boxes and unit step in the rank's own units (module doc), or why not."""
    size = shard.interleave
    whole = count == 1 or unit_step % shard.period == 0
    mapped = []
    for box in boxes:
        first, stop = box.units
        last = stop - 1 + (0 if whole else (count - 1) * unit_step)
        low = min(first, first + (0 if whole else (count - 1) * unit_step))
        if low // size != last // size or shard.owner(first) != shard.rank:
            return (f"units {first}..{stop - 1} (with its {count} chunks stepping "
                    f"{unit_step}) are not in one run of DCP rank {shard.rank} of "
                    f"{shard.size} (runs of {size} units)")
        local = shard.local(first)
        mapped.append(Box(box.layers, (local, local + stop - first), box.heads, box.row))
    step = unit_step // shard.period * size if whole and count > 1 else unit_step
    return mapped, step
