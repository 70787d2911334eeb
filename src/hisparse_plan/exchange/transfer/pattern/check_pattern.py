"""check_pattern: prove, from the two plans alone, that every request they admit
instantiates a pattern to a sound, complete program (see
docs/transfer.md#what-is-proved-once-what-per-request).

A request changes a pattern in two ways only, and each is proved once for all requests:
- the block ids: every row is proved at block id 0 with check_transfer's own decoding and
  its block stride against the plans' own (check_period): at any id it moves the same
  logical bytes of that block, inside its region up to the table's last id, so neither the
  ids nor the pool's size matter. Over one period, each destination rank's rows of each
  layer tile the period's units, heads and row bytes exactly, each row within its units;
- which rows of which periods it selects (`selected_units` of `num_tokens`): the start
  depends only on the first unit the destination needs modulo the period, the stop only on
  `num_tokens` modulo it, so every residue of each is checked (and every `num_tokens` up to
  where the rules repeat: a window, a chunk and two periods past them): the selection
  covers what the destination needs, starts in the block of its first unit and stops
  within the request's own blocks on both sides, and cuts no row (a block boundary on one
  side at least). A selection of whole rows of a tiled period then writes each needed
  byte exactly once.
The cost grows with rows per period and the period's units, never with a request's blocks
or tokens, nor with a pool's blocks. What only a request can say (its ids: enough of them,
each a block of its pool, none twice, none in two tables of one pool) `instantiate` checks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hisparse_plan.exchange.transfer.errors import TransferCheckError
from hisparse_plan.exchange.transfer.facts.side import Instance, as_instance
from hisparse_plan.exchange.transfer.pattern.check_period import layer_rule, prove_period
from hisparse_plan.exchange.transfer.pattern.parts import PatternLink, PatternTable
from hisparse_plan.exchange.transfer.pattern.transfer_pattern import TransferPattern
from hisparse_plan.exchange.transfer.program.match import match_layers
from hisparse_plan.exchange.transfer.program.units import chunk_start, window_start
from hisparse_plan.models.any_plan import Plan


@dataclass(frozen=True, slots=True)
class PatternProof:
    rows: int
    links: int
    token_counts: int
    """num_tokens values and residues whose selection was checked."""
    boxes: int
    """Logical boxes one period's rows were proved to write (disjoint, complete)."""


def check_pattern(pattern: TransferPattern, source: Instance | Plan | Sequence[Plan],
                  destination: Instance | Plan | Sequence[Plan]) -> PatternProof:
    """Prove `pattern` (module doc), or raise TransferCheckError naming what is wrong."""
    src, dst = as_instance(source), as_instance(destination)
    pairs = match_layers(src, dst)
    _same_tables(pattern, src, dst)
    if list(pattern.layers) != [pair.name for pair in pairs]:
        raise TransferCheckError(f"the pattern moves layers {list(pattern.layers)[:4]}...; "
                                 f"the plans pair {[p.name for p in pairs][:4]}...")
    expected = {pair.name: layer_rule(pair) for pair in pairs}
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
    counts = sum(_selections(link) for link in pattern.links)
    boxes = prove_period(pattern.rows, pattern.links,
                         (pattern.source_tables, pattern.destination_tables),
                         (pattern.source, pattern.destination), pairs, src, dst)
    return PatternProof(len(pattern.rows), len(pattern.links), counts, boxes)


def _selections(link: PatternLink) -> int:
    """Check the link's selection for every residue (module doc); returns the cases."""
    from hisparse_plan.exchange.transfer.pattern.instance import selected_units, start_unit

    def fault(tokens: int, reason: str | None) -> None:
        if reason is not None:
            raise TransferCheckError(f"link {link.source_table!r} -> "
                                     f"{link.destination_table!r}, {tokens} tokens: {reason}")

    counts = 0
    horizon = (link.window or 0) + (link.chunk or 0) + 2 * link.period * max(
        link.tokens_per_unit, 1) + 1
    for num_tokens in range(1, horizon + 1):
        fault(num_tokens, _selection_fault(link, num_tokens, selected_units(link, num_tokens)))
        counts += 1
    if link.kind == "tokens":
        # Every first unit a window or chunk may need: one of each residue of the period.
        for first in range(link.period):
            fault(first, _start_fault(link, first, start_unit(link, first)))
            counts += 1
    return counts


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
        if selected != (0, need):
            return f"selects pages {selected}, needs 0..{need}"
        return _stop_fault(link, need, stop, need)
    first = window_start(tokens, link.window)
    if link.chunk is not None:
        first = max(first, chunk_start(tokens, link.chunk))
    return _start_fault(link, first, start) or _stop_fault(link, tokens, stop, tokens)


def _start_fault(link: PatternLink, first: int, start: int) -> str | None:
    """Why a selection from unit `start` is wrong for a first needed unit `first`: after it,
    in an earlier block than its own on a side (ids a request need not give), or cutting a
    row (a block start on one side at least)."""
    units = (link.source_units, link.destination_units)
    if start > first or any(start // u != first // u for u in units):
        return f"starts at unit {start}, outside the block of unit {first}"
    if all(start % u for u in units):
        return f"starts at unit {start}, cutting a row of the period"
    return None


def _stop_fault(link: PatternLink, held_units: int, stop: int, need: int) -> str | None:
    """Why a selection up to unit `stop` is wrong for a request holding `held_units` units
    and needing `need`: short of them, past its last block on a side, or cutting a row."""
    units = (link.source_units, link.destination_units)
    held = [_ceil(held_units, u) for u in units]
    if stop < need or any(_ceil(stop, u) > h for u, h in zip(units, held, strict=True)):
        return f"stops at unit {stop}: not all {need} units, or past its {held} blocks"
    if all(stop % u for u in units):
        return f"stops at unit {stop}, cutting a row of the period"
    return None
