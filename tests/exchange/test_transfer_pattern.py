"""The transfer pattern over random pairs of plans (both engines; block sizes, layouts, TP,
HiSparse, window and Mamba layers): each pattern that compiles is proved by check_pattern,
and each of several random requests instantiates to rows that the reference executor runs
to the same effect as build_transfer's program: every (layer, unit, head, byte) read back
through the destination's own views, nothing else touched. Edited patterns are refused by
check_pattern, bad requests by instantiate. Each pattern is also staged (a few blocks a
round, so requests take several rounds), proved by check_staged, and each request's two
phases, row by row and by the numpy rearrangement, leave the destination as the pattern's
rows do; edited staged patterns are refused. HISPARSE_PATTERN_EXAMPLES sets the number of
pairs (1,000 by default: the plans are small)."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

from hisparse_plan.exchange.transfer import (
    TransferCheckError,
    TransferRefused,
    TransferRequest,
    build_transfer,
)
from hisparse_plan.exchange.transfer.executors.rearrange import execute_staged
from hisparse_plan.exchange.transfer.executors.reference import Buffers, buffers, execute
from hisparse_plan.exchange.transfer.pattern.check_pattern import check_pattern
from hisparse_plan.exchange.transfer.pattern.check_staged import check_staged
from hisparse_plan.exchange.transfer.pattern.compile import compile_transfer
from hisparse_plan.exchange.transfer.pattern.instance import selected_units
from hisparse_plan.exchange.transfer.pattern.staged_request import StagedRequest
from hisparse_plan.exchange.transfer.pattern.staging import StagedPattern, compile_staged
from hisparse_plan.exchange.transfer.pattern.transfer_pattern import TransferPattern
from support.transfer_strategies import Pair, pairs
from support.transfer_support import layer_shapes, oracle, request_blocks, wrong_bytes

EXAMPLES = int(os.environ.get("HISPARSE_PATTERN_EXAMPLES", "1000"))
REQUESTS = 3


def _compiled(pair: Pair) -> TransferPattern | None:
    note(f"{pair.family}: {pair.source.engine} x{pair.source.ranks} -> "
         f"{pair.destination.engine} x{pair.destination.ranks}")
    try:
        pattern = compile_transfer(pair.source, pair.destination)
    except TransferRefused as refused:
        if refused.what not in pair.refusal:
            raise
        event(f"{pair.family}: refused ({refused.what})")
        return None
    event(f"{pair.family}: {pair.source.engine} -> {pair.destination.engine}")
    if pair.family == "mamba":
        event("mamba: states across TP sizes" if pair.source.ranks != pair.destination.ranks
              else "mamba: states rank to rank")
    if pair.family == "pipeline":
        stages = [len(set(side.holders.values())) for side in (pair.source, pair.destination)]
        event(f"pipeline: {stages[0]} -> {stages[1]} stages of plans")
    return pattern


def _requests(pair: Pair, data: st.DataObject) -> list[tuple[TransferRequest, dict[str, int]]]:
    """The pair's own request and more of random lengths (where the pools hold them)."""
    found = [(pair.request, pair.firsts)]
    for _ in range(REQUESTS - 1):
        tokens = data.draw(st.integers(1, 260), label="num_tokens")
        seed = data.draw(st.integers(0, 2**16), label="seed")
        runs = data.draw(st.booleans(), label="runs")
        try:
            request = TransferRequest(
                num_tokens=tokens,
                source_blocks=request_blocks(pair.source, tokens, seed, runs=runs),
                destination_blocks=request_blocks(pair.destination, tokens, seed + 1,
                                                  runs=runs))
        except ValueError:
            continue  # the pools do not hold that many tokens
        found.append((request, {name: max(0, tokens - window)
                                for name, window in pair.windows.items()}))
    return found


def _reach(pair: Pair, firsts: dict[str, int]) -> dict[str, int]:
    """Where a window layer may start being written: the later of the two sides' block
    starts at or before its first unit (docs/transfer.md#sliding-windows)."""
    ours, theirs = layer_shapes(pair.source), layer_shapes(pair.destination)
    return {name: max(first // ours[name].units * ours[name].units,
                      first // theirs[name].units * theirs[name].units)
            for name, first in firsts.items()}


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(pairs(), st.data())
def test_instances_of_a_proved_pattern_move_what_build_transfer_moves(
        pair: Pair, data: st.DataObject) -> None:
    pattern = _compiled(pair)
    if pattern is None:
        return
    assert not pair.refusal, f"expected a refusal ({sorted(pair.refusal)})"
    staged = compile_staged(pattern, data.draw(st.integers(1, 4), label="slots"))
    check_staged(staged, pair.source, pair.destination)
    if staged.pattern is not pattern:
        check_pattern(pattern, pair.source, pair.destination)
        event("staged: wide rows cut into chunks")
    for number, (request, firsts) in enumerate(_requests(pair, data)):
        program = pattern.instantiate(request).program()
        built = build_transfer(pair.source, pair.destination, request)
        reach = _reach(pair, firsts)
        source, start, expected, allowed = oracle(pair.source, pair.destination, request,
                                                  program, firsts, reach, pair.states)
        ours = {key: value.copy() for key, value in start.items()}
        theirs = {key: value.copy() for key, value in start.items()}
        execute(program, source, ours)
        execute(built, source, theirs)
        assert wrong_bytes(ours, expected, allowed) == 0
        # Where the two differ, build_transfer left the byte alone and the pattern wrote the
        # source's value of a unit of the window's first block (before the window starts).
        for key in ours:
            differ = ours[key] != theirs[key]
            assert not (differ & (theirs[key] != start[key])).any()
            assert not (differ & (ours[key] != allowed[key])).any()
            if differ.any():
                event("a window's first block moved whole")
        assert program.bytes >= built.bytes
        made = staged.instantiate(request)
        event(f"staged: {min(len(made.rounds), 3)}+ rounds")
        for rows_by_row in (number == 0, False):
            staging = buffers(made.staging_regions(), fill=None, seed=number)
            result = {key: value.copy() for key, value in start.items()}
            _staged(made, source, staging, result, rows_by_row)
            for key in ours:
                assert np.array_equal(result[key], ours[key]), (key, rows_by_row)


def _staged(made: StagedRequest, source: Buffers, staging: Buffers, destination: Buffers,
            rows_by_row: bool) -> None:
    """Both phases of every round: the reference executor over each phase's rows, or the
    numpy executor's runs and moves."""
    if not rows_by_row:
        execute_staged(made, source, staging, destination)
        return
    for round_ in made.rounds:
        execute(made.phase1_program(round_), source, staging)
        execute(made.phase2_program(round_), staging, destination)


def _edits(pattern: TransferPattern) -> dict[str, TransferPattern]:
    rows = list(pattern.rows)
    first = rows[0]
    size = next(r.size for r in pattern.destination[first.dst_rank].regions
                if r.name == first.dst_region)
    link = pattern.links[first.link]
    edits = {
        "overlap": [*rows, first],
        "dropped row": rows[1:],
        "out of region": [first.model_copy(update={"dst_offset": size - first.length + 1}),
                          *rows[1:]],
        "shifted": [first.model_copy(update={"dst_offset": first.dst_offset + 1}), *rows[1:]],
        "block stride": [first.model_copy(update={
            "dst_block_stride": first.dst_block_stride + first.length}), *rows[1:]],
    }
    if link.period // link.destination_units > 1:
        edits["block parameter shifted"] = [first.model_copy(update={
            "dst_slot": (first.dst_slot + 1) % (link.period // link.destination_units)}),
            *rows[1:]]
    other = next((r.src_rank for r in rows if r.src_rank != first.src_rank), None)
    if other is not None:
        edits["wrong head interval"] = [first.model_copy(update={"src_rank": other}),
                                        *rows[1:]]
    states = [i for i, row in enumerate(rows) if pattern.links[row.link].kind == "state"]
    if states:
        at = states[0]
        state = rows[at]
        # Another piece of the same state (another channel block or head slice).
        wrong = next((rows[i] for i in states if rows[i].src_rank == state.src_rank
                      and rows[i].src_region == state.src_region
                      and rows[i].src_offset != state.src_offset
                      and rows[i].length == state.length), None)
        if wrong is not None:
            edits["wrong state slice"] = [*rows[:at], state.model_copy(update={
                "src_offset": wrong.src_offset}), *rows[at + 1:]]
        # The state written one block on: another slot of the state table.
        edits["state to the wrong slot"] = [*rows[:at], state.model_copy(update={
            "dst_offset": state.dst_offset + state.dst_block_stride}), *rows[at + 1:]]
    return {name: pattern.model_copy(update={"rows": edited}) for name, edited in edits.items()}


@settings(max_examples=max(20, EXAMPLES // 10), deadline=None,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(pairs())
def test_edited_patterns_are_refused(pair: Pair) -> None:
    pattern = _compiled(pair)
    if pattern is None or not pattern.rows:
        return
    for name, edited in _edits(pattern).items():
        if name == "wrong head interval" and _replicated(pair, edited):
            continue  # every source rank holds those rows: still a correct pattern
        note(name)
        with pytest.raises(TransferCheckError):
            check_pattern(edited, pair.source, pair.destination)
        event(f"refused: {name}")


def _staged_edits(staged: StagedPattern) -> dict[str, StagedPattern]:
    slabs = list(staged.slabs)
    first = slabs[0]
    edits: dict[str, dict[str, object]] = {
        "slab cut short": {"slabs": [first.model_copy(update={"length": first.length - 1}),
                                     *slabs[1:]]}
        if first.length > 1 else {},
        "slab past its block": {"slabs": [first.model_copy(update={
            "length": first.block_stride + 1}), *slabs[1:]]},
        "staging too small": {"staging_bytes": [
            max(size - 1, 0) if rank == first.dst_rank else size
            for rank, size in enumerate(staged.staging_bytes)]},
        "row without its slab": {"row_slab": [len(slabs), *staged.row_slab[1:]]},
    }
    same_rank = [s for s in slabs[1:] if s.dst_rank == first.dst_rank]
    if same_rank:
        second = slabs.index(same_rank[0])
        edits["staging areas overlap"] = {"slabs": [
            s.model_copy(update={"staging_offset": first.staging_offset}) if i == second
            else s for i, s in enumerate(slabs)]}
        edits["row read from another slab"] = {"row_slab": [
            second if i == staged.row_slab.index(0) else slab
            for i, slab in enumerate(staged.row_slab)]}
    return {name: staged.model_copy(update=update) for name, update in edits.items()
            if update}


@settings(max_examples=max(20, EXAMPLES // 10), deadline=None,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(pairs())
def test_edited_staged_patterns_are_refused(pair: Pair) -> None:
    pattern = _compiled(pair)
    if pattern is None or not pattern.rows:
        return
    staged = compile_staged(pattern, 2)
    for name, edited in _staged_edits(staged).items():
        note(name)
        with pytest.raises(TransferCheckError):
            check_staged(edited, pair.source, pair.destination)
        event(f"staged refused: {name}")


def _replicated(pair: Pair, pattern: TransferPattern) -> bool:
    from hisparse_plan.exchange.transfer.facts.side import rank_facts

    facts = rank_facts(pair.source.plans[0]).layers.get(pattern.rows[0].layer)
    return facts is None or facts.replicated or facts.heads * pair.source.ranks != (
        pair.source.total_kv_heads or facts.heads * pair.source.ranks)


@settings(max_examples=max(20, EXAMPLES // 10), deadline=None,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(pairs())
def test_bad_requests_are_refused(pair: Pair) -> None:
    pattern = _compiled(pair)
    if pattern is None or not pattern.rows:
        return
    request = pair.request
    table = pattern.links[pattern.rows[0].link].destination_table
    spec = next(t for t in pattern.destination_tables if t.name == table)
    ids = list(request.destination_blocks[table])
    # The last block a request moves is always read (a window's first blocks may not be).
    last = len(ids) - 1 if spec.state else -(-request.num_tokens // spec.block_tokens) - 1
    bad: dict[str, list[int]] = {
        "an id past the pool": [*ids[:last], spec.num_blocks, *ids[last + 1:]]}
    if spec.padding_blocks:
        bad["the null block"] = [*ids[:last], 0, *ids[last + 1:]]
    bad["too few blocks"] = [] if spec.state else ids[:last]
    # An id given twice is refused where both are read: a window's link may not read the
    # block before its last (its ids there are not the request's to check).
    link = pattern.links[pattern.rows[0].link]
    first = selected_units(link, request.num_tokens)[0] // link.destination_units
    if last > 0 and not spec.state and last - 1 >= first:
        bad["a repeated id"] = [*ids[:last], ids[last - 1], *ids[last + 1:]]
    for name, edited in bad.items():
        note(name)
        blocks = dict(request.destination_blocks) | {table: edited}
        with pytest.raises(TransferRefused):
            pattern.instantiate(request.model_copy(update={"destination_blocks": blocks}))
        event(f"refused: {name}")
    with pytest.raises(TransferRefused, match="no such block table"):
        pattern.instantiate(request.model_copy(update={
            "source_blocks": dict(request.source_blocks) | {"nonesuch": [1]}}))


def test_the_pattern_is_json_and_back() -> None:
    from hisparse_plan.exchange.transfer import Instance
    from support.transfer_support import deepseek_plan

    src = Instance([deepseek_plan(hisparse=False, layers=2)])
    dst = Instance([deepseek_plan(hisparse=True, layers=2)])
    pattern = compile_transfer(src, dst)
    again = TransferPattern.model_validate_json(pattern.model_dump_json())
    assert again == pattern
    check_pattern(again, src, dst)
    request = TransferRequest(num_tokens=300, source_blocks=request_blocks(src, 300, 1),
                              destination_blocks=request_blocks(dst, 300, 2))
    made = again.instantiate(request)
    assert np.array_equal(made.rows, pattern.instantiate(request).rows)
