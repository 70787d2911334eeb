"""Median plan() latency: HiSparse (DeepSeek-V3.2, GLM-5, synthetic 1,000 / 10,000 layers) and
regular planning (Gemma-3-27B, Qwen3-Next-80B, DeepSeek-V3.2 without HiSparse, 2,000
alternating sliding/full layers).

    .venv/bin/python benchmarks/bench_plan.py [--seconds S]

Requests are validated once, outside the timing: what is timed is `plan()` alone, called back
to back; each figure is the median of single-call timings (min and validation cost beside it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import hisparse_plan as hp

GOLDEN = Path(__file__).resolve().parent.parent / "tests" / "golden"


def golden(case: str) -> dict[str, Any]:
    request: dict[str, Any] = json.loads((GOLDEN / f"{case}.request.json").read_text())
    return request


def synthetic(num_layers: int) -> dict[str, Any]:
    """DeepSeek-like: half sparse layers (leaders), half indexers, one pair per model layer."""
    request = golden("deepseek_v32_fp8")
    sparse, indexer = (request["layers"][f"model.layers.0.self_attn.{suffix}"]
                       for suffix in ("attn", "indexer.k_cache"))
    request["layers"] = {}
    for i in range(num_layers // 2):
        request["layers"][f"model.layers.{i}.self_attn.attn"] = sparse
        request["layers"][f"model.layers.{i}.self_attn.indexer.k_cache"] = indexer
    request["model"]["max_model_len"] = 8192
    request["hisparse"]["host_pool_gib"] = 4096.0
    request["device"]["available_bytes"] = 1 << 40
    return request


def alternating(num_layers: int) -> dict[str, Any]:
    """gpt-oss-like: sliding-window (128) and full attention layers, alternating."""
    request = golden("regular_gpt_oss_120b")
    sliding, full = (request["layers"][f"model.layers.{i}.self_attn.attn"] for i in (0, 1))
    request["layers"] = {
        f"model.layers.{i}.self_attn.attn": sliding if i % 2 == 0 else full
        for i in range(num_layers)
    }
    request["model"]["max_model_len"] = 32768
    request["device"]["available_bytes"] = 1 << 40
    return request


def median_latency(request: hp.PlanRequest, seconds: float) -> tuple[float, float, int]:
    """(median, min) seconds per call over at least `seconds` of calls, and the call count."""
    for _ in range(20):
        hp.plan(request)
    samples: list[int] = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or len(samples) < 30:
        start = time.perf_counter_ns()
        hp.plan(request)
        samples.append(time.perf_counter_ns() - start)
    return statistics.median(samples) / 1e9, min(samples) / 1e9, len(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="timing per model")
    args = parser.parse_args()
    models = [
        ("DeepSeek-V3.2", golden("deepseek_v32_fp8")),
        ("GLM-5", golden("glm5_fp8_blhnc")),
        ("synthetic-1000", synthetic(1000)),
        ("synthetic-10000", synthetic(10000)),
        ("Gemma-3-27B", golden("regular_gemma3_27b_swa")),
        ("Qwen3-Next-80B", golden("regular_qwen3_next_80b_mamba")),
        ("DeepSeek-V3.2-reg", golden("regular_deepseek_v32_no_hisparse_lbnhc")),
        ("alternating-2000", alternating(2000)),
        ("alternating-20000", alternating(20000)),
    ]
    print(f"{'model':<18} {'layers':>7} {'median':>11} {'min':>11} {'per layer':>10} "
          f"{'validate':>11} {'calls':>7}")
    for name, raw in models:
        start = time.perf_counter()
        request = hp.PlanRequest.model_validate(raw)
        validate = time.perf_counter() - start
        median, fastest, calls = median_latency(request, args.seconds)
        layers = len(request.layers)
        print(f"{name:<18} {layers:>7} {median * 1e6:>9.1f}us {fastest * 1e6:>9.1f}us "
              f"{median / layers * 1e9:>8.0f}ns {validate * 1e6:>9.0f}us {calls:>7}")


if __name__ == "__main__":
    main()
