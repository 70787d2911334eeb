"""The path an engine calls, against vLLM's own planning, side by side in one run.

Ours: `request_from_vllm` (vLLM specs and config in) + `plan` + `to_kv_cache_config` (vLLM's
KVCacheConfig out). vLLM's: `get_global_kv_cache_groups` + `get_kv_cache_configs` with its
default builder, the engine's flow (tests/support/vllm_support.py `run_vllm`). Both get the same
spec
objects and engine config, for DeepSeek-V3.2 (HiSparse), Qwen3-Next-80B and Gemma-3-27B. The
two are timed call by call, alternately, so a busy machine slows both alike; each figure is a
median. Also: JSON text to plan (`PlanRequest.model_validate_json` + `plan`) for DeepSeek-V3.2,
with its parse, validation and planning apart and the cost of one plain pydantic model here.

    PYTHONPATH=src:tests /work/vllm34/bin/python benchmarks/bench_engine_path.py [--calls N]

The engine config is the real `VllmConfig` tests/support/vllm_support.py builds on the CPU platform.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic_core import from_json

import hisparse_plan as hp
from bench_plan import golden
from hisparse_plan.adapters.vllm.types import VllmObject

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

REQUEST = REPO / "src/hisparse_plan/data/deepseek_v32_fp8.request.json"
CASES = (
    ("DeepSeek-V3.2", "deepseek_v32_fp8"),
    ("Qwen3-Next-80B", "regular_qwen3_next_80b_mamba"),
    ("Gemma-3-27B", "regular_gemma3_27b_swa"),
)
TARGET = 0.3


def timed_ns(action: Callable[[], object]) -> int:
    start = time.perf_counter_ns()
    action()
    return time.perf_counter_ns() - start


class _Calibration(BaseModel):
    """A model with nothing of ours in it: what one validated model costs on this machine."""

    a: int
    b: int
    c: int
    d: int
    e: int


def json_to_plan(calls: int) -> dict[str, float]:
    """Median microseconds of JSON text to plan for DeepSeek-V3.2 and of its parts, each in a
    loop of its own (as an engine calls it, again and again): the JSON parse alone (pydantic's
    parser), validating the text into a request (parse included), planning a validated request,
    and one five-field pydantic model (how fast this machine validates anything)."""
    text = REQUEST.read_text()
    request = hp.PlanRequest.model_validate_json(text)
    actions: dict[str, tuple[Callable[[], object], int]] = {
        "json to plan": (lambda: hp.plan(hp.PlanRequest.model_validate_json(text)), calls),
        "parse": (lambda: from_json(text), calls),
        "validate": (lambda: hp.PlanRequest.model_validate_json(text), calls),
        "plan": (lambda: hp.plan(request), calls),
        "one model": (lambda: _Calibration(a=1, b=2, c=3, d=4, e=5), calls * 10),
    }
    figures = {}
    for name, (action, count) in actions.items():
        for _ in range(20):  # warm-up
            action()
        figures[name] = statistics.median(timed_ns(action) for _ in range(count)) / 1e3
    return figures


def engine_path(case: str, calls: int) -> dict[str, Any]:
    """Median microseconds of vLLM's planning and of ours (and of our three steps) for one
    golden case, timed alternately."""
    from vllm.v1.core import kv_cache_planning  # type: ignore[import-not-found, unused-ignore]

    from hisparse_plan.adapters.vllm import request_from_vllm, to_kv_cache_config
    from support import vllm_support as vs

    inputs = vs.vllm_inputs(golden(case))
    workers = inputs.worker_specs()
    memory = inputs.worker_memory()
    specs = inputs.specs

    def theirs(config: VllmObject) -> VllmObject:
        groups = kv_cache_planning.get_global_kv_cache_groups(config, workers)
        return kv_cache_planning.get_kv_cache_configs(config, workers, memory, groups)

    steps: dict[str, list[int]] = {"vllm": [], "ours": [], "request": [], "plan": [],
                                   "config": []}
    with vs.vllm_world(vs.DEFAULT_BUILDER, inputs.shared_host_pool):
        for call in range(calls + 10):
            config = copy.deepcopy(inputs.config)  # vLLM's auto-fit writes into its config
            vllm_ns = timed_ns(partial(theirs, config))
            start = time.perf_counter_ns()
            request = request_from_vllm(specs, inputs.config, inputs.available_bytes)
            requested = time.perf_counter_ns()
            plan = hp.plan(request)
            planned = time.perf_counter_ns()
            to_kv_cache_config(plan, specs)
            done = time.perf_counter_ns()
            if call < 10:
                continue  # warm-up
            steps["vllm"].append(vllm_ns)
            steps["ours"].append(done - start)
            steps["request"].append(requested - start)
            steps["plan"].append(planned - requested)
            steps["config"].append(done - planned)
    figures: dict[str, Any] = {name: statistics.median(values) / 1e3
                               for name, values in steps.items()}
    figures["layers"] = len(specs)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300, help="timed calls per figure")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    parts = json_to_plan(args.calls)
    print(f"JSON text to plan, DeepSeek-V3.2: median {parts['json to plan']:.0f} us (target: "
          f"median < 500 us); its parts: parse {parts['parse']:.0f} us, validate (parse "
          f"included) {parts['validate']:.0f} us, plan {parts['plan']:.0f} us; one five-field "
          f"pydantic model {parts['one model']:.2f} us")
    try:
        # vLLM's CPU platform, as tests/support/vllm_support.py sets it, before vLLM resolves one.
        os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
        import vllm  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        print("vLLM is not installed here: engine path not measured")
        return
    print(f"engine path against vLLM {vllm.__version__}'s own planning (median us; target: "
          f"ours <= {TARGET}x vLLM)")
    print(f"{'model':<16} {'specs':>6} {'vLLM':>9} {'ours':>8} {'ratio':>6} "
          f"{'request':>8} {'plan':>7} {'config':>7}")
    for name, case in CASES:
        try:
            f = engine_path(case, args.calls)
        except Exception as error:  # report what fails and measure the rest
            print(f"{name:<16} failed: {type(error).__name__}: {str(error)[:200]}")
            continue
        print(f"{name:<16} {f['layers']:>6} {f['vllm']:>9.0f} {f['ours']:>8.0f} "
              f"{f['ours'] / f['vllm']:>6.2f} {f['request']:>8.0f} {f['plan']:>7.0f} "
              f"{f['config']:>7.0f}")


if __name__ == "__main__":
    main()
