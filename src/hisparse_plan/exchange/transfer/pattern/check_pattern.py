"""check_pattern: prove, from the two plans alone, that every request they admit
instantiates a pattern to a sound, complete program (see
docs/transfer.md#what-is-proved-once-what-per-request).

A request changes a pattern in two ways only, and each is proved once:
- which rows of which periods it selects (`selected_units` of `num_tokens`): checked for
  every `num_tokens` up to where the rules repeat (a window, a chunk and two periods past
  them), against what the destination needs, computed here: the units it attends to, all
  within the request's own blocks on both sides, every row of a period wholly in or out;
- the block ids: a row is affine in its block id on each side, and so is each plan's
  address of a logical byte; a row proved at two requests whose ids differ at every
  position (the pool's lowest ids, then its highest, in reverse) has each side's block
  stride right and stays in its region for every id between. Each row lies in one block of
  each side (its units within one block), so rows of other periods, at other blocks, never
  meet it, and distinct block ids keep them apart.
Those two probe requests (each at least one period of every link, and past every window or
chunk where the pools hold it) are proved with check_transfer's own decoding: each row reads
and writes the same logical bytes, the rows share no byte and cover every unit, head and
byte each layer needs on each destination rank. The cost grows with rows per period (and the
window in blocks), never with a request's blocks or tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import lcm

from hisparse_plan.exchange.transfer.errors import TransferCheckError
from hisparse_plan.exchange.transfer.facts.side import Instance, as_instance
from hisparse_plan.exchange.transfer.pattern.parts import PatternLink, PatternTable
from hisparse_plan.exchange.transfer.pattern.transfer_pattern import TransferPattern
from hisparse_plan.exchange.transfer.program.match import LayerPair, match_layers
from hisparse_plan.exchange.transfer.program.transfer_program import TransferRequest
from hisparse_plan.exchange.transfer.proof.check import check_transfer
from hisparse_plan.models.any_plan import Plan


@dataclass(frozen=True, slots=True)
class PatternProof:
    rows: int
    links: int
    token_counts: int
    """num_tokens values whose selection was checked."""
    probes: tuple[int, ...]
    """num_tokens of the probe requests proved with check_transfer."""


def check_pattern(pattern: TransferPattern, source: Instance | Plan | Sequence[Plan],
                  destination: Instance | Plan | Sequence[Plan]) -> PatternProof:
    """Prove `pattern` (module doc), or raise TransferCheckError naming what is wrong."""
    from hisparse_plan.exchange.transfer.pattern.instance import selected_units

    src, dst = as_instance(source), as_instance(destination)
    pairs = match_layers(src, dst)
    _same_tables(pattern, src, dst)
    if list(pattern.layers) != [pair.name for pair in pairs]:
        raise TransferCheckError(f"the pattern moves layers {list(pattern.layers)[:4]}...; "
                                 f"the plans pair {[p.name for p in pairs][:4]}...")
    expected = {pair.name: _link(pair) for pair in pairs}
    for link in pattern.links:
        if link not in expected.values():
            raise TransferCheckError(f"link {link.source_table!r} -> "
                                     f"{link.destination_table!r}: no layer of the plans has "
                                     "this rule")
    for index, row in enumerate(pattern.rows):
        _row_in_one_block(index, row.link, row.unit_start, row.unit_stop, row.src_slot,
                          row.dst_slot, pattern.links)
        if row.layer not in expected or pattern.links[row.link] != expected[row.layer]:
            raise TransferCheckError(f"row {index}: its link is not layer {row.layer!r}'s "
                                     "rule", row=index)
    counts = 0
    for link in pattern.links:
        horizon = (link.window or 0) + (link.chunk or 0) + 2 * link.period * max(
            link.tokens_per_unit, 1) + 1
        for num_tokens in range(1, horizon + 1):
            reason = _selection_fault(link, num_tokens, selected_units(link, num_tokens))
            if reason is not None:
                raise TransferCheckError(f"link {link.source_table!r} -> "
                                         f"{link.destination_table!r}, {num_tokens} tokens: "
                                         f"{reason}")
            counts += 1
    probes = _probe_tokens(pattern)
    for number, tokens in enumerate(probes):
        request = _probe(pattern, tokens, high=number % 2 == 1)
        check_transfer(pattern.instantiate(request).program(), src, dst)
    return PatternProof(len(pattern.rows), len(pattern.links), counts, tuple(probes))


def _link(pair: LayerPair) -> PatternLink:
    """The rule the plans give a layer, read here from the pair's facts."""
    src, dst = pair.source, pair.destination
    units = (1, 1) if src.kind == "state" else (src.units_per_block, dst.units_per_block)
    tokens = src.kind == "tokens"
    chunk = src.chunk if src.chunk is not None else dst.chunk
    return PatternLink(source_table=src.table, destination_table=dst.table, kind=src.kind,
                       source_units=units[0], destination_units=units[1],
                       period=lcm(*units), tokens_per_unit=src.tokens_per_unit,
                       window=pair.window if tokens else None, chunk=chunk if tokens else None)


def _same_tables(pattern: TransferPattern, src: Instance, dst: Instance) -> None:
    for what, listed, side in (("source", pattern.source_tables, src),
                               ("destination", pattern.destination_tables, dst)):
        ours = {PatternTable(name=t.key, block_tokens=t.block_tokens, num_blocks=t.num_blocks,
                             padding_blocks=t.padding_blocks, state=t.state)
                for t in side.tables.values()}
        if set(listed) != ours or len(listed) != len(ours):
            raise TransferCheckError(f"the pattern's {what} tables are not its plans' (ids "
                                     "a request may give would go unchecked)")
    shared = set()
    for what, side in (("source", src), ("destination", dst)):
        regions: dict[str, set[str]] = {}
        for facts in side.facts:
            for layer in facts.layers.values():
                if layer.name in pattern.layers:
                    regions.setdefault(layer.table, set()).update(f.region for f in layer.fields)
        names = sorted(regions)
        shared |= {(what, a, b) for i, a in enumerate(names) for b in names[i + 1:]
                   if regions[a] & regions[b]}
    if not shared <= set(pattern.shared):
        missing = sorted(shared - set(pattern.shared))[0]
        raise TransferCheckError(f"the pattern does not say that {missing[0]} tables "
                                 f"{missing[1]!r} and {missing[2]!r} share a region")


def _row_in_one_block(index: int, link: int, start: int, stop: int, src_slot: int,
                      dst_slot: int, links: Sequence[PatternLink]) -> None:
    if link >= len(links):
        raise TransferCheckError(f"row {index}: link {link} does not exist", row=index)
    rule = links[link]
    if not 0 <= start < stop <= rule.period:
        raise TransferCheckError(f"row {index}: units {start}..{stop} leave the period of "
                                 f"{rule.period}", row=index)
    for what, units, slot in (("source", rule.source_units, src_slot),
                              ("destination", rule.destination_units, dst_slot)):
        if start // units != slot or (stop - 1) // units != slot:
            raise TransferCheckError(f"row {index}: units {start}..{stop - 1} are not all in "
                                     f"{what} block {slot} of the period", row=index)


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _selection_fault(link: PatternLink, tokens: int, selected: tuple[int, int]) -> str | None:
    """Why the units selected for `tokens` are not what the destination needs (in its own
    blocks, rows of a period wholly in or out), or None."""
    start, stop = selected
    if link.kind == "state":
        return None if selected == (0, 1) else f"selects {selected}, not the one state"
    if link.kind == "pages":
        need = _ceil(tokens, link.tokens_per_unit)
        return None if selected == (0, need) else f"selects pages {selected}, needs 0..{need}"
    first = 0 if link.window is None else max(0, tokens - link.window)
    if link.chunk is not None:
        first = max(first, tokens - (tokens % link.chunk))
    ends = []
    for units in (link.source_units, link.destination_units):
        held = _ceil(tokens, units)  # the blocks a request of `tokens` holds
        if start > first or start // units != first // units:
            return f"starts at unit {start}, outside the block of unit {first}"
        if stop < tokens or _ceil(stop, units) > held:
            return f"stops at unit {stop}: not all {tokens} tokens, or past its {held} blocks"
        ends.append((start % units == 0, stop % units == 0))
    if not (ends[0][0] or ends[1][0]) or not (ends[0][1] or ends[1][1]):
        return f"units {start}..{stop} cut a row of the period"
    return None


def _probe_tokens(pattern: TransferPattern) -> list[int]:
    """Two requests of one period of every link (or of all the pools hold, if less); two
    more past every window and chunk where the pools hold them."""
    period = 1
    reach = 0
    for link in pattern.links:
        period = lcm(period, link.period * max(link.tokens_per_unit, 1))
        reach = max(reach, (link.window or 0) + (link.chunk or 0))
    found = [period, period]
    longer = _ceil(reach + period, period) * period
    if reach and longer <= _capacity(pattern):
        found += [longer, longer]
    # Pools smaller than a period: every request the pools admit is at most their capacity,
    # and a request of that many tokens selects every row any of them selects.
    capacity = max(_capacity(pattern), 1)
    return [tokens for tokens in found if tokens <= capacity] or [capacity, capacity]


def _capacity(pattern: TransferPattern) -> int:
    """Tokens every table can give blocks for at once (_probe gives tables of one size of
    pool ids apart, as tables of one pool need)."""
    fewest = None
    for tables in (pattern.source_tables, pattern.destination_tables):
        for table in tables:
            if table.state:
                continue
            sharing = sum(1 for other in tables
                          if other.num_blocks == table.num_blocks and not other.state)
            tokens = (table.num_blocks - table.padding_blocks) // sharing * table.block_tokens
            fewest = tokens if fewest is None else min(fewest, tokens)
    return 2**40 if fewest is None else fewest


def _probe(pattern: TransferPattern, tokens: int, *, high: bool) -> TransferRequest:
    """Blocks for every table: the lowest ids in order, or the highest in reverse (tables
    with pools of one size take ids apart: those that share a pool must)."""
    blocks = []
    for tables in (pattern.source_tables, pattern.destination_tables):
        found: dict[str, list[int]] = {}
        taken: dict[int, int] = {}
        for table in tables:
            count = 1 if table.state else _ceil(tokens, table.block_tokens)
            used = taken.get(table.num_blocks, 0)
            if high:
                ids = list(range(table.num_blocks - 1 - used, table.num_blocks - 1 - used
                                 - count, -1))
            else:
                ids = list(range(table.padding_blocks + used,
                                 table.padding_blocks + used + count))
            taken[table.num_blocks] = used + count
            found[table.name] = ids
        blocks.append(found)
    return TransferRequest(num_tokens=tokens, source_blocks=blocks[0],
                           destination_blocks=blocks[1])
