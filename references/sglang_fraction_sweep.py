"""SGLang's default mem_fraction_static against the planner's, over a grid of GPUs, tensor
parallel sizes, models and the settings the rule reads.

Run in the SGLang venv with the project's src on the path:

    PYTHONPATH=references/sglang_stubs:references:src /work/sglang/bin/python \\
        references/sglang_fraction_sweep.py [--quick]

For every point SGLang resolves its ServerArgs (``sglang_reference.memory_defaults``: the
GPU-memory query answers the GPU's figure) and ``memory_rule.default_mem_fraction_static``
computes the fraction from SGLangSettings; the two must be equal floats (where SGLang's
rule leaves no memory, a fraction <= 0, the planner refuses instead).  Prints one line per
mismatch and a summary; exits 1 on any mismatch.
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path
from typing import Any

import sglang_reference
from hisparse_plan.models.sglang_settings import SGLangSettings
from hisparse_plan.presets.hardware import GPUS
from hisparse_plan.targets.sglang.memory_rule import default_mem_fraction_static

REPO = Path(__file__).resolve().parent.parent
MIB = 1 << 20

SMALL_GPUS = {"t4-16gb": 15360 * MIB, "a10-24gb": 23028 * MIB, "a100-40gb": 40960 * MIB,
              "l40s-48gb": 46068 * MIB}
"""Memory figures of the tiers below the presets (nvidia-smi memory.total, MiB)."""
MODELS = {
    "llama-3.1-8b": "tests/hf_configs/llama-3.1-8b-instruct/config.json",
    "deepseek-v3.2": "tests/hf_configs/deepseek-v3.2-exp/config.json",
    "deepseek-v3": "tests/hf_configs/deepseek-v3/config.json",
    "gpt-oss-120b": "tests/hf_configs/gpt-oss-120b/config.json",
    "qwen3-next": "tests/hf_configs/qwen3-next-80b-a3b-instruct/config.json",
}
OPTIONS: list[dict[str, Any]] = [
    {},
    {"chunked_prefill_size": 4096},
    {"chunked_prefill_size": 1024},
    {"chunked_prefill_size": 12000},
    {"max_running_requests": 64},
    {"max_running_requests": 600},
    {"max_total_tokens": 3000},
    {"disable_prefill_cuda_graph": True},
    {"disable_decode_cuda_graph": True},
    {"chunked_prefill_size": 32768, "max_running_requests": 100, "max_total_tokens": 20000},
]
"""Settings the rule reads, as SGLang server arguments (also SGLangSettings fields)."""


def _is_mla(config_path: str) -> bool:
    config = json.loads((REPO / config_path).read_text())
    return "kv_lora_rank" in config


def _ours(gpu_bytes: int, tp: int, mla: bool, options: dict[str, Any]) -> float | str:
    settings = SGLangSettings(name="sglang", context_length=8192, gpu_memory_bytes=gpu_bytes,
                              tp_size=tp, **options)
    try:
        return default_mem_fraction_static(settings, mla=mla)
    except ValueError as error:
        return f"refused: {error}"


def _theirs(model: str, gpu_bytes: int, tp: int, options: dict[str, Any]) -> float | str:
    case = {"config": model, "server_args": {"tp_size": tp, "context_length": 8192, **options},
            "gpu": {"total_memory_bytes": gpu_bytes}}
    try:
        value: float = sglang_reference.memory_defaults(case)["mem_fraction_static"]
    except Exception as error:  # SGLang's refusals are plain exceptions
        return f"refused: {type(error).__name__}: {error}"
    return value


def main(argv: list[str]) -> int:
    gpus = {gpu.name: gpu.hbm_bytes for gpu in GPUS} | SMALL_GPUS
    models = MODELS
    options = OPTIONS
    if "--quick" in argv:
        options = OPTIONS[:2]
    checked = mismatched = 0
    for (gpu, gpu_bytes), tp, (name, path), option in itertools.product(
        gpus.items(), (1, 2, 4, 8), models.items(), options
    ):
        ours = _ours(gpu_bytes, tp, _is_mla(path), option)
        theirs = _theirs(path, gpu_bytes, tp, option)
        checked += 1
        same = ours == theirs and type(ours) is type(theirs)
        if isinstance(ours, str) and isinstance(theirs, float) and theirs <= 0:
            same = True  # SGLang resolves a fraction of nothing; the planner refuses it
        if not same:
            mismatched += 1
            print(f"MISMATCH {gpu} tp{tp} {name} {option}: ours {ours!r}, SGLang {theirs!r}")
    print(f"{checked} points, {mismatched} mismatches")
    return 1 if mismatched else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
