"""A DCP rank's units as runs on both sides' blocks (see
docs/transfer.md#decode-context-parallelism): the request's units cut where a source block or
one of the destination's blocks (the request's, `block_size * dcp` units) ends, and in each
piece the rank's runs, one `dcp * interleave` apart, as one group: a source run steps by that
period, the rank's own positions by the interleave."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

from hisparse_plan.exchange.transfer.facts.context import ContextShard
from hisparse_plan.exchange.transfer.program.units import UnitGroup


def piece_groups(lo: int, hi: int, shard: ContextShard, src: tuple[int, int],
                 dst: tuple[int, int], local_units: int) -> list[UnitGroup]:
    """The rank's units of [lo, hi), a piece in one block of each side: `src` and `dst` are
    (block id, the source's unit in it of unit `lo`), `local_units` the rank's units a
    block. The destination's unit is the rank's own position within its block."""
    groups = []
    for first, length, count in shard.runs(lo, hi):
        many = count > 1
        groups.append(UnitGroup(
            first, length, count, src[0], src[1] + first - lo, 0,
            shard.period if many else 0, dst[0], shard.local(first) % local_units, 0,
            shard.interleave if many else 0, shard.period if many else 0))
    return groups


def shard_groups(first: int, stop: int, src_ids: Sequence[int], src_units: int,
                 dst_ids: Sequence[int], dst_units: int, shard: ContextShard
                 ) -> list[UnitGroup]:
    """Units [first, stop) that DCP rank `shard` holds, as groups that each lie in one block
    on both sides (`dst_units`: the request's units per destination block)."""
    local_units = dst_units // shard.size
    cuts = sorted({first, stop, *range(first // src_units * src_units + src_units, stop,
                                       src_units),
                   *range(first // dst_units * dst_units + dst_units, stop, dst_units)})
    groups: list[UnitGroup] = []
    for lo, hi in pairwise(cuts):
        src_pos, src_n = divmod(lo, src_units)
        groups.extend(piece_groups(lo, hi, shard, (src_ids[src_pos], src_n),
                                   (dst_ids[lo // dst_units], 0), local_units))
    return groups
