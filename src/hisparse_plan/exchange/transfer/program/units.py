"""Map tokens to units and blocks: which of a request's units a layer moves, and where each
lies on both sides (see docs/transfer.md#what-is-moved). Rows split where either side's block
ends and merge again where both sides' blocks keep step: the common granularity."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hisparse_plan.exchange.transfer.errors import TransferRefused
from hisparse_plan.exchange.transfer.facts.rank_facts import TableFacts
from hisparse_plan.exchange.transfer.program.match import LayerPair


@dataclass(frozen=True, slots=True)
class UnitGroup:
    """`count` runs of `length` units, run `j` being units `[unit + j * step, ...)` (`step`
    is `unit_step`, or `length` where it is 0: runs that follow one another); on each side run
    `j` starts at unit `n + j * n_step` of block `block + j * block_step`."""

    unit: int
    length: int
    count: int
    src_block: int
    src_n: int
    src_block_step: int
    src_n_step: int
    dst_block: int
    dst_n: int
    dst_block_step: int
    dst_n_step: int
    unit_step: int = 0
    """Units from one run to the next where they do not follow one another (a DCP rank's
    runs); 0: `length`."""


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def moved_tokens(num_tokens: int, src_block: int, dst_block: int) -> int:
    """Tokens moved: the request's, up to where the shorter of the two last blocks ends (a
    whole last block moves when the block sizes agree; bytes past the request's last token
    stay inside its own blocks)."""
    return min(ceil_div(num_tokens, src_block) * src_block,
               ceil_div(num_tokens, dst_block) * dst_block)


def window_start(num_tokens: int, window: int | None) -> int:
    """A window layer needs its last `window` tokens only (the next token attends to the
    window before it)."""
    return 0 if window is None else max(0, num_tokens - window)


def chunk_start(num_tokens: int, chunk: int | None) -> int:
    """A chunked-local layer needs the tokens of the chunk the next token falls in."""
    return 0 if chunk is None else num_tokens // chunk * chunk


def needed_units(pair: LayerPair, num_tokens: int) -> tuple[int, int]:
    """[first, stop) of the units the layer moves, and needs at least [first, its own stop)."""
    src, dst = pair.source, pair.destination
    if src.kind == "state":
        return 0, 1
    if src.kind == "pages":
        return 0, ceil_div(num_tokens, src.tokens_per_unit)
    chunk = src.chunk if src.chunk is not None else dst.chunk
    first = max(window_start(num_tokens, pair.window), chunk_start(num_tokens, chunk))
    return first, moved_tokens(num_tokens, src.units_per_block, dst.units_per_block)


def required_units(pair: LayerPair, num_tokens: int) -> tuple[int, int]:
    """[first, stop) of the units the destination needs (what check_transfer demands)."""
    first, stop = needed_units(pair, num_tokens)
    return first, min(stop, num_tokens) if pair.source.kind == "tokens" else stop


def table_blocks(
    side: str, table: TableFacts, given: Mapping[str, Sequence[int]], layer: str,
    first: int, stop: int, units_per_block: int,
) -> list[int]:
    """The block ids of the positions the units [first, stop) fall in, checked: each a block
    of the pool (not a padding block), none twice. A state table gives its last block."""
    ids = given.get(table.key)
    where = f"{side}_blocks[{table.key!r}]"
    if ids is None:
        raise TransferRefused(
            f"{where}: no blocks given for table {table.key!r}, which layer {layer!r} uses "
            f"(expected block ids in token order)", layer=layer, what="blocks", field=where)
    if table.state:
        if not ids:
            raise TransferRefused(f"{where}: expected the request's state blocks, got none",
                                  layer=layer, what="blocks", field=where)
        ids = [ids[-1]]
    needed = ceil_div(stop, units_per_block)
    if len(ids) < needed:
        raise TransferRefused(
            f"{where}: the request's {stop} units need {needed} blocks, got {len(ids)}",
            layer=layer, what="blocks", field=where)
    used = list(ids[first // units_per_block: needed])
    for block in used:
        if not table.padding_blocks <= block < table.num_blocks:
            raise TransferRefused(
                f"{where}: block {block} is not one a request is given: expected "
                f"{table.padding_blocks} <= block < {table.num_blocks}",
                layer=layer, what="blocks", field=where)
    if len(set(used)) != len(used):
        raise TransferRefused(f"{where}: a block is given twice", layer=layer, what="blocks",
                              field=where)
    return list(ids[:needed])


def unit_groups(
    first: int, stop: int, src_ids: Sequence[int], src_units: int, dst_ids: Sequence[int],
    dst_units: int,
) -> list[UnitGroup]:
    """Units [first, stop) as runs that each lie in one block on both sides, runs of one
    length whose blocks keep step grouped (a run of consecutive blocks is one group)."""
    groups: list[UnitGroup] = []
    unit = first
    while unit < stop:
        src_pos, src_n = divmod(unit, src_units)
        dst_pos, dst_n = divmod(unit, dst_units)
        length = min(src_units - src_n, dst_units - dst_n, stop - unit)
        src_block, dst_block = src_ids[src_pos], dst_ids[dst_pos]
        if groups and _extends(groups[-1], unit, length, src_block, src_n, dst_block, dst_n):
            last = groups[-1]
            groups[-1] = UnitGroup(
                last.unit, length, last.count + 1, last.src_block, last.src_n,
                src_block - last.src_block if last.count == 1 else last.src_block_step,
                src_n - last.src_n if last.count == 1 else last.src_n_step,
                last.dst_block, last.dst_n,
                dst_block - last.dst_block if last.count == 1 else last.dst_block_step,
                dst_n - last.dst_n if last.count == 1 else last.dst_n_step,
            )
        else:
            groups.append(UnitGroup(unit, length, 1, src_block, src_n, 0, 0, dst_block, dst_n,
                                    0, 0))
        unit += length
    return groups


def _extends(group: UnitGroup, unit: int, length: int, src_block: int, src_n: int,
             dst_block: int, dst_n: int) -> bool:
    """The next run continues the group: same length, and on each side it keeps the group's
    step (the first step sets it), each step moving forward."""
    if length != group.length or unit != group.unit + group.count * group.length:
        return False
    j = group.count
    if j == 1:
        steps = (src_block - group.src_block, src_n - group.src_n,
                 dst_block - group.dst_block, dst_n - group.dst_n)
        return min(steps) >= 0 and steps[:2] != (0, 0) and steps[2:] != (0, 0)
    return (
        src_block == group.src_block + j * group.src_block_step
        and src_n == group.src_n + j * group.src_n_step
        and dst_block == group.dst_block + j * group.dst_block_step
        and dst_n == group.dst_n + j * group.dst_n_step
    )


def no_block_twice(side: str, used: dict[str, set[int]], regions: dict[str, set[str]]) -> None:
    """Tables whose layers share a pool (vLLM's groups overlay its blocks) share its block
    ids: a block given to two of them would be written twice."""
    keys = sorted(used)
    for index, first in enumerate(keys):
        for second in keys[index + 1:]:
            common = used[first] & used[second] if regions[first] & regions[second] else set()
            if common:
                raise TransferRefused(
                    f"{side}_blocks: block {min(common)} is given to tables {first!r} and "
                    f"{second!r}, whose layers share a pool; expected each block once",
                    what="blocks", field=f"{side}_blocks[{second!r}]")
