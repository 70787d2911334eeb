"""Pattern-edit fuzzing, a slice: random single and double edits of the JSON of patterns and
staged patterns of the shapes that beat the probe proof (a window shorter than a period on
both engines, tables sharing a pool, pools of a few blocks), each edit check_pattern or
check_staged accepts instantiated and run by the reference executor and judged by the transfer
oracle, never by the checks. references/fuzz_pattern_edits.py runs the same fuzzer over every
seed pair at 40,000 edits."""

from __future__ import annotations

from support.pattern_edit_fuzz import report, run

EDITS = 400
PAIRS = 4
"""gpt-oss-120b's window between vLLM block 16 and 256, SGLang page 64 -> 16 with a 40-token
window, Llama-3-8B in 8-block pools, and vLLM's window and full groups sharing a pool."""
GEOMETRY = frozenset({"src_offset", "dst_offset", "src_block_stride", "dst_block_stride",
                      "src_slot", "dst_slot", "unit_start", "unit_stop", "offset", "length",
                      "block_stride", "staging_offset", "count", "src_stride", "dst_stride"})
"""The slice edits where rows and slabs lie (the full fuzzer edits every field)."""


def test_every_accepted_pattern_edit_moves_the_right_bytes() -> None:
    tally = run(seed=0, edits=EDITS, pairs=PAIRS, focus=GEOMETRY)
    outcomes = tally.outcomes
    assert tally.seeds == PAIRS, report(tally)
    assert outcomes["tried"] == EDITS
    # Not vacuous: edits reach the checks, some are refused and some accepted and judged.
    assert outcomes["refused"] > EDITS // 10
    assert outcomes["accepted sound"] > 0
    assert tally.failures == 0, report(tally)
