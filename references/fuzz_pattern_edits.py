"""Fuzz check_pattern and check_staged with random single and double edits of the JSON of
patterns and staged patterns compiled for unlike seed pairs (tests/support/pattern_edit_seeds.py:
both engines, TP either way, block and page sizes, layouts, HiSparse host pools, Mamba
states, pipeline stages, chunked-local layers, windows shorter than a period, tables sharing
a pool, pools of a few blocks). Every edit a check accepts is instantiated for the seed's
requests and run by the reference executor (a staged one by the numpy staged executor), then
judged by the transfer oracle's own arithmetic against what the destination's views must
hold, with canaries in every other block (tests/support/pattern_edit_fuzz.py says how); never by the
checks themselves.

    PYTHONPATH=src python references/fuzz_pattern_edits.py [--seed 0] [--edits 40000]
        [--pairs N] [--double 0.3]

Prints how the edits ended and every kind of accepted-but-unsound edit or exception outside
the PlanError family (or pydantic's ValidationError) with examples; exits 1 if there is any.
tests/exchange/test_pattern_edit_fuzz.py runs it smaller.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--edits", type=int, default=40_000, help="edits (default 40000)")
    parser.add_argument("--pairs", type=int, default=None,
                        help="use the first N seed pairs (default: all)")
    parser.add_argument("--double", type=float, default=0.3,
                        help="share of edits that change two places (default 0.3)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO / "tests"))
    from support.pattern_edit_fuzz import Tally, report, run

    started = time.perf_counter()

    def progress(tally: Tally) -> None:
        print(f"  {tally.outcomes['tried']} edits, {tally.failures} failures, "
              f"{time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)

    tally = run(args.seed, args.edits, args.pairs, progress, args.double)
    print(report(tally))
    print(f"{tally.outcomes['tried']} edits in {time.perf_counter() - started:.1f} s, seed "
          f"{args.seed}: {tally.failures} failures")
    return 1 if tally.failures else 0


if __name__ == "__main__":
    sys.exit(main())
