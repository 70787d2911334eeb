"""Fuzz check_plan with random single edits of real plans, for vLLM and SGLang.

Seed plans are the planner's own, a few layers each and small enough to enumerate byte by byte:
model presets (Llama-3-8B, Gemma-3-27B, gpt-oss-120b, Qwen3-Next-80B, Llama-4-Scout,
DeepSeek-V3.2 with and without HiSparse, GLM-5, DeepSeek-V4-Flash), for SGLang also every server
mode it plans (tests/support/plan_edit_seeds.py SGLANG_MODES: pipeline ranks, a rank of window
layers
only, speculative drafts and Mamba intermediates, DP attention, decode context parallelism,
HiSparse's metadata, the radix cache off, Llama-4's windows, shared-index placeholders), and
random requests. Each edit
(a number, name, literal, flag or list changed in one place, or a pool renamed everywhere) goes
through validation and `check_plan`; every edit check_plan accepts is judged by an oracle of its
own arithmetic (tests/support/plan_edit_oracle_vllm.py, tests/support/plan_edit_oracle_sglang.py:
their
docstrings say what is sound) and, if it changed the plan, by `check_plan(plan, request=...)`,
which must refuse it.

    PYTHONPATH=src python references/fuzz_plan_edits.py [--seed 0] [--edits 20000]
        [--engine vllm|sglang|both]

Prints, per engine, how the edits ended and every kind of accepted-but-unsound edit with
examples; exits 1 if any accepted edit is unsound (or too large to judge), any changed plan
passed with its request, or anything but a ValidationError or PlanError escaped. The fuzzer is
tests/support/plan_edit_fuzz.py (tests/checking/test_plan_edit_fuzz.py runs it smaller).
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
    parser.add_argument("--edits", type=int, default=20_000,
                        help="edits per engine (default 20000)")
    parser.add_argument("--engine", choices=["vllm", "sglang", "both"], default="both")
    parser.add_argument("--seed-plans", type=int, default=12, metavar="N",
                        help="random-request seed plans per engine, beside the presets' "
                        "(default 12)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO / "tests"))
    from support.plan_edit_fuzz import Tally, report, run

    engines = ["vllm", "sglang"] if args.engine == "both" else [args.engine]
    failures = 0
    total = 0
    started = time.perf_counter()
    for engine in engines:
        began = time.perf_counter()

        def progress(tally: Tally, began: float = began) -> None:
            print(f"  {tally.engine}: {tally.outcomes['tried']} edits, "
                  f"{time.perf_counter() - began:.0f} s", file=sys.stderr, flush=True)

        tally = run(engine, args.seed, args.edits, args.seed_plans, progress)
        print(report(tally))
        print(f"  ({time.perf_counter() - began:.1f} s)\n", flush=True)
        failures += tally.failures
        total += tally.outcomes["tried"]
    print(f"{total} edits in {time.perf_counter() - started:.1f} s, seed {args.seed}: "
          f"{failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
