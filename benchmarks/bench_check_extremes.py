"""Cost in heads: check_plan() on two-layer plans whose pages have 10^7 heads apart (LHBNC,
BHLNC), beside one head, so the two figures can be compared. Each figure is one call.

    .venv/bin/python benchmarks/bench_check_extremes.py [--heads 1 10000000]

The proof sums a page's heads up by arithmetic, so the check column should not grow with heads.
"""

from __future__ import annotations

import argparse
import time
import tracemalloc
from typing import Any

import hisparse_plan as hp


def heads_request(heads: int, layout: str) -> dict[str, Any]:
    """A full-attention and a sliding-window layer (two groups overlaying one pool)."""
    base = {"block_size": 16, "num_kv_heads": heads, "head_size": 128, "dtype": "bfloat16"}
    return {
        "layers": {
            "model.layers.0.attn": {"kind": "full_attention", **base},
            "model.layers.1.attn": {"kind": "sliding_window", "sliding_window": 4096, **base},
        },
        "model": {"max_model_len": 1024},
        "device": {"available_bytes": 2**62, "kv_cache_layout": layout},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heads", type=int, nargs="+", default=[1, 10_000_000])
    args = parser.parse_args()
    print(f"{'layout':<7} {'heads':>10} {'plan':>9} {'check':>9} {'check peak':>11}")
    for layout in ("LHBNC", "BHLNC"):
        for heads in args.heads:
            start = time.perf_counter()
            plan = hp.plan(heads_request(heads, layout))
            planned = time.perf_counter()
            tracemalloc.start()
            checked_from = time.perf_counter()
            hp.check_plan(plan)
            checked = time.perf_counter()
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            print(f"{layout:<7} {heads:>10} {planned - start:>8.3f}s "
                  f"{checked - checked_from:>8.3f}s {peak / 2**10:>8.1f}KiB")


if __name__ == "__main__":
    main()
