"""Every SGLang plan of a broad seeded set of requests, one JSON line each: a regression tool for
refactors of targets/sglang/ that must leave every plan (and every refusal) byte-identical.

    python references/sglang_plan_snapshot.py --out before.jsonl
    ... change the target ...
    python references/sglang_plan_snapshot.py --out after.jsonl
    cmp before.jsonl after.jsonl        # or: --compare before.jsonl

The set: every preset under several server settings; the random cases of sglang_diff.py (every
model kind, seeds 0..2); every golden request's layers with SGLang's defaults and variants; and
random requests written directly (layers of every kind SGLang plans or refuses, settings drawn
over every SGLangSettings field), seeded. Each line holds the plan's JSON, or the refusal's type,
field and message. When the target offers `plan_traced`, the traced plan must equal the plain
one (the line says so if not).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from hisparse_plan.adapters.sglang import request_from_server_args
from hisparse_plan.errors import HisparsePlanError
from hisparse_plan.models.request import PlanRequest
from hisparse_plan.presets.catalog import load_preset, preset_names
from hisparse_plan.targets import sglang as target

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import sglang_diff  # noqa: E402  (beside this file)

GOLDEN = HERE.parent.parent / "shared" / "golden"
"""The golden cases: /work/shared/golden beside the checkout, else tests/golden's copy."""
GIB = 1 << 30
H200_TOTAL = 150_754_820_096
H200_FREE = 149_250_113_536

Case = tuple[str, Callable[[], PlanRequest]]


def _golden_dir() -> Path:
    for path in (GOLDEN, HERE.parent / "tests" / "golden"):
        if path.is_dir():
            return path
    raise SystemExit("no golden cases found")


def _outcome(make: Callable[[], PlanRequest]) -> dict[str, Any]:
    try:
        request = make()
    except (HisparsePlanError, ValidationError, OSError, ValueError) as error:
        return {"request_refused": f"{type(error).__name__}: {error}"}
    try:
        plan = target.plan_sglang(request)
    except (HisparsePlanError, ValidationError) as error:
        line: dict[str, Any] = {"refused": f"{type(error).__name__}: {error}",
                                "field": getattr(error, "field", None)}
        traced_error = _traced_refusal(request)
        if traced_error is not None and traced_error != line["refused"]:
            line["traced_differs"] = traced_error
        return line
    line = {"plan": plan.model_dump_json()}
    traced = getattr(target, "plan_traced", None)
    if traced is not None and traced(request).plan != plan:
        line["traced_differs"] = True
    return line


def _traced_refusal(request: PlanRequest) -> str | None:
    traced = getattr(target, "plan_traced", None)
    if traced is None:
        return None
    try:
        traced(request)
    except (HisparsePlanError, ValidationError) as error:
        return f"{type(error).__name__}: {error}"
    return "planned"


def preset_cases() -> Iterator[Case]:
    settings: list[tuple[str, dict[str, Any], dict[str, Any], dict[str, Any] | None]] = [
        ("40gib", {"context_length": 8192}, {"available_bytes": 40 * GIB}, None),
        ("h200-0.88", {"mem_fraction_static": 0.88},
         {"pre_model_load_free_bytes": H200_FREE, "post_weights_free_bytes": H200_FREE - 30 * GIB},
         None),
        ("h200-default", {"context_length": 32768},
         {"pre_model_load_free_bytes": H200_FREE, "post_weights_free_bytes": H200_FREE - 30 * GIB},
         {"total_memory_bytes": H200_TOTAL}),
        ("fp8-page64", {"kv_cache_dtype": "fp8_e4m3", "page_size": 64,
                        "max_running_requests": 48}, {"available_bytes": 20 * GIB}, None),
        ("trtllm-cap", {"kv_cache_dtype": "fp8_e4m3", "dsa_backend": "trtllm",
                        "max_total_tokens": 100_000}, {"available_bytes": 60 * GIB}, None),
        ("hisparse", {"kv_cache_dtype": "fp8_e4m3", "enable_hisparse": True,
                      "hisparse_config": {"top_k": 1024, "host_to_device_ratio": 4}},
         {"available_bytes": 50 * GIB}, None),
        ("small", {"context_length": 4096}, {"available_bytes": 1 * GIB}, None),
        ("v4-page", {"mem_fraction_static": 0.9, "swa_full_tokens_ratio": 0.2},
         {"pre_model_load_free_bytes": H200_FREE, "post_weights_free_bytes": H200_FREE - 60 * GIB},
         None),
    ]
    for name in preset_names():
        arch = load_preset(name).architecture
        for tp in (1, 8):
            for label, args, memory, gpu in settings:
                server_args = {"tp_size": tp, **args}
                make = partial(request_from_server_args, arch, server_args, memory, gpu=gpu)
                yield f"preset/{name}/tp{tp}/{label}", make


def diff_cases() -> Iterator[Case]:
    fixed = sorted((HERE / "sglang_cases").glob("*.json"))
    cases = [sglang_diff.fixed_case(path) for path in fixed
             if path.name != "deepseek_v4_flash_config.json"]
    for seed in range(3):
        cases += sglang_diff.make_cases(seed, 100, list(sglang_diff.KINDS))
    root = HERE.parent
    for case in cases:
        config = case["config"]
        if isinstance(config, str):
            config = str(root / config)
        make = partial(request_from_server_args, config, case["server_args"], case["memory"],
                       gpu=case.get("gpu"))
        yield f"diff/{case['name']}", make


def golden_cases() -> Iterator[Case]:
    variants: list[tuple[str, dict[str, Any]]] = [
        ("defaults", {"context_length": 8192}),
        ("fp8", {"context_length": 4096, "kv_cache_dtype": "fp8_e4m3", "page_size": 64}),
        ("hisparse", {"context_length": 4096, "enable_hisparse": True, "hisparse_top_k": 512}),
        ("fraction", {"context_length": 2048, "gpu_memory_bytes": H200_TOTAL,
                      "pre_model_load_free_bytes": H200_FREE,
                      "post_weights_free_bytes": H200_FREE - 20 * GIB}),
    ]
    for path in sorted(_golden_dir().glob("*.request.json")):
        data = json.loads(path.read_text())
        for keep_hisparse in (False, True):
            for label, engine in variants:
                copy = json.loads(json.dumps(data))
                if not keep_hisparse:
                    copy["hisparse"] = None
                copy["engine"] = {"name": "sglang", **engine}

                make = partial(PlanRequest.model_validate, copy)
                stem = path.name.removesuffix(".request.json")
                yield f"golden/{stem}/{label}/{'vllm-hisparse' if keep_hisparse else 'plain'}", make


def _mha(rng: random.Random, kind: str = "full_attention", **extra: object) -> dict[str, Any]:
    head = rng.choice([64, 128, 256])
    layer = {"kind": kind, "block_size": rng.choice([16, 64]),
             "num_kv_heads": rng.choice([1, 2, 8]), "head_size": head,
             "dtype": rng.choice(["bfloat16", "float16", "uint8", "float32"]), **extra}
    if rng.random() < 0.15:
        layer["head_size_v"] = head // 2
    return layer


def _latent(rng: random.Random) -> dict[str, Any]:
    if rng.random() < 0.5:
        return {"kind": "mla", "block_size": 64, "head_size": 576, "dtype": "uint8",
                "cache_dtype": "fp8_ds_mla", "state_content_bytes": 656}
    return {"kind": "mla", "block_size": 64, "head_size": rng.choice([576, 576, 512, 64]),
            "dtype": rng.choice(["bfloat16", "bfloat16", "float16"])}


INDEXER = {"kind": "mla", "block_size": 64, "head_size": 132, "dtype": "uint8",
           "cache_role": "indexer"}
MAMBA = {"kind": "mamba", "block_size": 16, "state_shapes": [[3, 256], [8, 64, 64]],
         "state_dtypes": ["bfloat16", "float32"]}


def _v4_layers() -> dict[str, Any]:
    arch = load_preset("deepseek-v4-flash").architecture
    request = request_from_server_args(arch, {"mem_fraction_static": 0.9},
                                       {"available_bytes": 40 * GIB})
    layers: dict[str, Any] = request.model_dump(mode="json")["layers"]
    return layers


def _layers(rng: random.Random, family: str, v4: dict[str, Any]) -> dict[str, Any]:
    n = rng.randrange(1, 6)
    if family == "mha":
        one = _mha(rng)
        return {f"model.layers.{i}.attn": one for i in range(n)}
    if family == "swa":
        full, window = _mha(rng), _mha(rng, "sliding_window", sliding_window=rng.choice(
            [16, 128, 1024]))
        if rng.random() < 0.8:
            window = {**full, "kind": "sliding_window", "sliding_window": window["sliding_window"]}
        layers = {f"model.layers.{2 * i}.attn": full for i in range(n)}
        layers.update({f"model.layers.{2 * i + 1}.attn": window for i in range(n)})
        return layers
    if family in ("mla", "dsa"):
        row = _latent(rng)
        layers = {f"model.layers.{i}.attn": row for i in range(n)}
        if family == "dsa":
            count = n if rng.random() < 0.9 else max(1, n - 1)
            layers.update({f"model.layers.{i}.indexer": INDEXER for i in range(count)})
        return layers
    if family == "mamba":
        layers = {f"model.layers.{i}.mamba": MAMBA for i in range(n)}
        attention = rng.randrange(1, 3) if rng.random() < 0.85 else 0
        one = _mha(rng)
        layers.update({f"model.layers.{n + i}.attn": one for i in range(attention)})
        return layers
    if family == "v4":
        names = list(v4)
        cut = len(names) if rng.random() < 0.7 else rng.randrange(1, len(names))
        return {name: v4[name] for name in names[:cut]}
    # a mix SGLang's reader refuses, or layers it does not plan
    return rng.choice([
        {"a": _mha(rng), "b": _latent(rng)},
        {"a": _mha(rng, "sliding_window", sliding_window=64)},
        {"a": _mha(rng, "chunked_local_attention", attention_chunk_size=64), "b": _mha(rng)},
        {"a": MAMBA},
        {"a": INDEXER},
        {"a": MAMBA, "b": _mha(rng, "sliding_window", sliding_window=64), "c": _mha(rng)},
    ])


def _pick(rng: random.Random, *values: object) -> object:
    return rng.choice(values)


def _engine(rng: random.Random, family: str) -> dict[str, Any]:
    engine: dict[str, Any] = {
        "name": "sglang",
        "context_length": _pick(rng, 1, 64, 2048, 8192, 131072, 1 << 20),
        "page_size": _pick(rng, None, None, 1, 16, 64, 64, 256),
        "kv_cache_dtype": _pick(rng, "auto", "auto", "bfloat16", "float16", "fp8_e4m3",
                                "fp8_e5m2"),
        "dsa_backend": _pick(rng, None, None, "flashmla_kv", "trtllm", "tilelang",
                             "flashmla_sparse", "fa3"),
        "max_running_requests": _pick(rng, None, None, 1, 7, 48, 256, 5000),
        "max_total_tokens": _pick(rng, None, None, None, 100, 4096, 1_000_000),
        "mem_fraction_static": _pick(rng, None, None, 0.5, 0.88, 0.95),
        "gpu_memory_bytes": _pick(rng, None, None, 8 * GIB, 24 * GIB, 80 * GIB, H200_TOTAL,
                                  192 * GIB),
        "tp_size": _pick(rng, 1, 2, 4, 8, 16),
        "chunked_prefill_size": _pick(rng, None, None, 512, 2048, 16384),
        "disable_decode_cuda_graph": rng.random() < 0.2,
        "disable_prefill_cuda_graph": rng.random() < 0.2,
        "swa_full_tokens_ratio": _pick(rng, None, None, 0.05, 0.1, 0.5, 1.0, 2.0),
        "mamba_full_memory_ratio": _pick(rng, 0.9, 0.9, 0.1, 2.0),
        "max_mamba_cache_size": _pick(rng, None, None, 3, 50, 1000),
        "mamba_ssm_dtype": _pick(rng, None, None, "float32", "bfloat16", "float16"),
        "speculative_num_draft_tokens": None if rng.random() < 0.9 else 4,
        "enable_hisparse": rng.random() < (0.6 if family == "dsa" else 0.1),
        "hisparse_top_k": _pick(rng, 2048, 64, 512),
        "hisparse_device_buffer_size": _pick(rng, None, None, 32, 1024, 4096),
        "hisparse_host_to_device_ratio": _pick(rng, 2, 1, 4, 8),
    }
    if rng.random() < 0.4:
        free = rng.choice([H200_FREE, 80 * GIB, 24 * GIB])
        engine["pre_model_load_free_bytes"] = free
        engine["post_weights_free_bytes"] = int(free * rng.uniform(0.2, 0.95))
    if family == "v4" and rng.random() < 0.75:  # mostly what SGLang's V4 path takes
        engine.update(dsa_backend=None, enable_hisparse=False, speculative_num_draft_tokens=None,
                      kv_cache_dtype=_pick(rng, "auto", "fp8_e4m3"),
                      page_size=_pick(rng, None, 256), gpu_memory_bytes=None)
    if family == "dsa" and rng.random() < 0.6:
        engine["page_size"] = 64
    return {key: value for key, value in engine.items() if value is not None}


def random_cases(seed: int, count: int) -> Iterator[Case]:
    rng = random.Random(seed)
    v4 = _v4_layers()
    families = ["mha", "swa", "mla", "dsa", "mamba", "v4", "other"]
    for i in range(count):
        family = families[i % len(families)]
        data: dict[str, Any] = {
            "layers": _layers(rng, family, v4),
            "model": {"max_model_len": 4096},
            "device": {"available_bytes": _pick(rng, 0, 1 << 20, 256 << 20, 4 * GIB, 40 * GIB,
                                                1 << 40)},
            "engine": _engine(rng, family),
        }
        roll = rng.random()
        if roll < 0.02:
            data["device"]["num_blocks_override"] = 100
        elif roll < 0.04:
            data["scheduler"] = {"decode_context_parallel_size": 2}
        elif roll < 0.05:
            data["engine"] = None
        yield f"random/{seed}/{i}/{family}", partial(PlanRequest.model_validate, data)


def all_cases(count: int) -> Iterator[Case]:
    yield from preset_cases()
    yield from diff_cases()
    yield from golden_cases()
    for seed in range(3):
        yield from random_cases(seed, count)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--count", type=int, default=700, help="random requests per seed")
    parser.add_argument("--compare", type=Path, help="a previous --out to diff against")
    args = parser.parse_args(argv)
    totals = {"plans": 0, "refusals": 0, "traced_differs": 0}
    with args.out.open("w", encoding="utf-8") as out:
        for name, make in all_cases(args.count):
            line = _outcome(make)
            totals["plans" if "plan" in line else "refusals"] += 1
            totals["traced_differs"] += "traced_differs" in line
            out.write(json.dumps({"name": name, **line}, sort_keys=True) + "\n")
    print(", ".join(f"{key} {value}" for key, value in totals.items()))
    if args.compare is None:
        return 1 if totals["traced_differs"] else 0
    before = args.compare.read_text(encoding="utf-8").splitlines()
    after = args.out.read_text(encoding="utf-8").splitlines()
    differ = [json.loads(a)["name"] for a, b in zip(after, before, strict=False) if a != b]
    print(f"compared {min(len(before), len(after))} requests ({len(before)} before, "
          f"{len(after)} after): {len(differ)} differ")
    for name in differ[:20]:
        print("  differs:", name)
    return 1 if differ or len(before) != len(after) or totals["traced_differs"] else 0


if __name__ == "__main__":
    sys.exit(main())
