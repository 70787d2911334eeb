"""Median plan() latency: HiSparse (DeepSeek-V3.2, GLM-5, synthetic 1,000 / 10,000 layers) and
regular planning (Gemma-3-27B, Qwen3-Next-80B, DeepSeek-V3.2 without HiSparse, 2,000
alternating sliding/full layers).

    .venv/bin/python benchmarks/bench_plan.py [--seconds S]

Requests are validated once, outside the timing: what is timed is `plan()` alone, called back
to back; each figure is the median of single-call timings (min and validation cost beside it).
`outputs` is the part of `plan()` spent validating the plan's own models (groups, specs, tensors,
pools), measured by validating the finished plan again from its field values.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

import hisparse_plan as hp
from hisparse_plan.models.layer_specs import LAYER_SPEC_CLASSES

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


def built_fields(value: object) -> object:
    """A plan's models as plain field values, its layer specs kept as built models."""
    if isinstance(value, BaseModel) and type(value) not in LAYER_SPEC_CLASSES:
        return {name: built_fields(getattr(value, name)) for name in type(value).model_fields}
    if isinstance(value, dict):
        return {key: built_fields(item) for key, item in value.items()}
    if isinstance(value, list):
        return [built_fields(item) for item in value]
    return value


def output_validation(plan: hp.KVCachePlan, calls: int = 200) -> float:
    """Median seconds pydantic takes to validate a finished plan's models (groups, specs,
    tensors, pools, capacity) from their values: the share of plan() that only skipping
    validation could remove."""
    fields = built_fields(plan)
    if hp.KVCachePlan.model_validate(fields) != plan:
        raise SystemExit("the rebuilt plan differs from the planned one")
    samples = []
    for _ in range(calls):
        start = time.perf_counter_ns()
        hp.KVCachePlan.model_validate(fields)
        samples.append(time.perf_counter_ns() - start)
    return statistics.median(samples) / 1e9


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
          f"{'validate':>11} {'outputs':>11} {'calls':>7}")
    for name, raw in models:
        start = time.perf_counter()
        request = hp.PlanRequest.model_validate(raw)
        validate = time.perf_counter() - start
        median, fastest, calls = median_latency(request, args.seconds)
        layers = len(request.layers)
        outputs = output_validation(hp.plan(request))
        print(f"{name:<18} {layers:>7} {median * 1e6:>9.1f}us {fastest * 1e6:>9.1f}us "
              f"{median / layers * 1e9:>8.0f}ns {validate * 1e6:>9.0f}us "
              f"{outputs * 1e6:>9.1f}us {calls:>7}")


if __name__ == "__main__":
    main()
