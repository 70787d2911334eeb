"""Cost in layers: plan() and check_plan() at 10,000 and 100,000 layers of nearly all-distinct
specs, regular and HiSparse. Each figure is one call (the cost is seconds, not microseconds).

    .venv/bin/python benchmarks/bench_scale.py [--layers 10000 100000]

A linear planner takes about 10x as long for 10x the layers; the ratio column says how far
from that each step is.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import hisparse_plan as hp

GIB = 2**30


def distinct_regular(layers: int) -> dict[str, Any]:
    """Full-attention layers whose head sizes nearly all differ: one family, one group of many
    specs (every layer its own bucket and tensor)."""
    specs = {
        f"model.layers.{i}.attn": {
            "kind": "full_attention", "block_size": 16, "num_kv_heads": 1,
            "head_size": 1 + i % 50_000, "dtype": "bfloat16",
        }
        for i in range(layers)
    }
    return {"layers": specs, "model": {"max_model_len": 1024},
            "device": {"available_bytes": 2**50}}


def distinct_hisparse(layers: int) -> dict[str, Any]:
    """Sparse/indexer pairs whose specs nearly all differ (a cache_dtype tag each) but share
    one page, as resident/hot packs need; every source layer a leader."""
    specs: dict[str, Any] = {}
    for i in range(layers // 2):
        tag = f"variant-{i % 50_000}"
        specs[f"model.layers.{i}.attn"] = {
            "kind": "mla", "block_size": 64, "head_size": 656, "dtype": "uint8",
            "is_index_group_leader": True, "cache_dtype": tag,
        }
        specs[f"model.layers.{i}.indexer"] = {
            "kind": "mla", "block_size": 64, "head_size": 132, "dtype": "uint8",
            "cache_role": "indexer", "cache_dtype": tag,
        }
    return {"layers": specs, "model": {"max_model_len": 1024, "index_topk": 64},
            "hisparse": {"host_pool_gib": 4096.0}, "device": {"available_bytes": 2**50}}


def timed(step: Callable[[], object]) -> tuple[float, object]:
    start = time.perf_counter()
    result = step()
    return time.perf_counter() - start, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[10_000, 100_000])
    args = parser.parse_args()
    print(f"{'model':<10} {'layers':>8} {'validate':>9} {'plan':>9} {'check':>9} "
          f"{'plan ratio':>11} {'check ratio':>12}")
    for name, build in (("regular", distinct_regular), ("hisparse", distinct_hisparse)):
        previous: tuple[int, float, float] | None = None
        for layers in args.layers:
            raw = build(layers)
            validate, request = timed(partial(hp.PlanRequest.model_validate, raw))
            assert isinstance(request, hp.PlanRequest)
            planning, plan = timed(partial(hp.plan, request))
            assert isinstance(plan, hp.KVCachePlan)
            checking, _ = timed(partial(hp.check_plan, plan))
            ratios = ("", "")
            if previous is not None:
                scale = layers / previous[0]
                ratios = (f"{planning / previous[1]:.1f}x/{scale:.0f}x",
                          f"{checking / previous[2]:.1f}x/{scale:.0f}x")
            print(f"{name:<10} {layers:>8} {validate:>8.2f}s {planning:>8.2f}s "
                  f"{checking:>8.2f}s {ratios[0]:>11} {ratios[1]:>12}")
            previous = (layers, planning, checking)


if __name__ == "__main__":
    main()
