"""The transfer property over random pairs of plans (both engines): every program that builds
is proved by check_transfer, the reference executor moves every (layer, token, head, byte)
to where the destination's own views place it and touches nothing else, and edited programs
are refused. HISPARSE_TRANSFER_EXAMPLES sets the number of pairs (the slow variant runs
1,000 or more; CI runs the default)."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, event, given, note, settings

from hisparse_plan.exchange.transfer import (
    TransferCheckError,
    TransferProgram,
    TransferRefused,
    build_transfer,
    check_transfer,
)
from support.transfer_strategies import Pair, pairs
from support.transfer_support import count_wrong

EXAMPLES = int(os.environ.get("HISPARSE_TRANSFER_EXAMPLES", "200"))


def _moved(pair: Pair) -> TransferProgram | None:
    note(f"{pair.family}: {pair.source.engine} x{pair.source.ranks} -> "
         f"{pair.destination.engine} x{pair.destination.ranks}, "
         f"{pair.request.num_tokens} tokens")
    try:
        program = build_transfer(pair.source, pair.destination, pair.request)
    except TransferRefused as refused:
        what = refused.what
        if what not in pair.refusal:
            raise
        event(f"{pair.family}: refused ({what})")
        return None
    assert not pair.refusal, f"expected a refusal ({sorted(pair.refusal)})"
    event(f"{pair.family}: {pair.source.engine} -> {pair.destination.engine}")
    return program


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(pairs())
def test_every_program_is_proved_and_moves_every_byte_where_it_belongs(pair: Pair) -> None:
    program = _moved(pair)
    if program is None:
        return
    check_transfer(program, pair.source, pair.destination)
    assert count_wrong(pair.source, pair.destination, pair.request, program, pair.firsts,
                       states=pair.states) == 0


def _edits(program: TransferProgram) -> dict[str, TransferProgram]:
    rows = list(program.rows)
    first = rows[0]
    last_region = first.dst_region
    size = next(r.size for r in program.destination[first.dst_rank].regions
                if r.name == last_region)
    edits = {
        "overlap": [*rows, first],
        "dropped": rows[1:],
        "out of region": [first.model_copy(update={"dst_offset": size - first.length + 1}),
                          *rows[1:]],
        "shifted": [first.model_copy(update={"dst_offset": first.dst_offset + 1}), *rows[1:]],
    }
    other = next((r for r in rows if r.src_rank != first.src_rank), None)
    if other is not None and program.source[0].engine == program.source[-1].engine:
        edits["another source rank"] = [first.model_copy(update={"src_rank": other.src_rank}),
                                         *rows[1:]]
    return {name: program.model_copy(update={"rows": edited})
            for name, edited in edits.items()}


@settings(max_examples=max(20, EXAMPLES // 5), deadline=None,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(pairs())
def test_edited_programs_are_refused(pair: Pair) -> None:
    program = _moved(pair)
    if program is None or not program.rows:
        return
    for name, edited in _edits(program).items():
        if name == "another source rank" and _replicated(pair, program):
            continue  # every source rank holds the same rows: still a correct program
        note(name)
        with pytest.raises(TransferCheckError):
            check_transfer(edited, pair.source, pair.destination)


def _replicated(pair: Pair, program: TransferProgram) -> bool:
    from hisparse_plan.exchange.transfer.facts.side import rank_facts

    layer = program.rows[0].layer
    facts = rank_facts(pair.source.plans[0]).layers.get(layer)
    return facts is None or facts.replicated or facts.heads * pair.source.ranks != (
        pair.source.total_kv_heads or facts.heads * pair.source.ranks)
