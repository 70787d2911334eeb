"""Real plans to edit: the planner's own plans of model presets (a few layers each; for SGLang
also in each of its server modes, SGLANG_MODES) and of random requests, for vLLM and SGLang, all
small (tens to a few thousand blocks) so that the oracles can
enumerate every byte."""

from __future__ import annotations

import random
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import hisparse_plan as hp
from hisparse_plan.adapters.sglang.request import sglang_request
from hisparse_plan.models import PlanRequest
from hisparse_plan.models.any_plan import Plan
from hisparse_plan.models.sglang_settings import SGLangSettings
from hisparse_plan.presets import Settings, build_request, load_preset
from hisparse_plan.presets.config_file import load_config_file
from hisparse_plan.targets import plan_for_engine
from support import paths

MIB = 2**20
GEMMA3N = paths.HF_CONFIGS / "gemma-3n-e4b-it" / "config.json"
DECODER_INDEX = re.compile(r"layers\.(\d+)\.")


@dataclass(frozen=True, slots=True)
class Seed:
    name: str
    request: PlanRequest
    plan: Plan


def _decoder(name: str) -> int:
    found = DECODER_INDEX.search(name)
    return int(found.group(1)) if found else 0


def _keep(data: dict[str, Any], decoders: set[int], heads: int | None = None) -> dict[str, Any]:
    """The request with only the layers of `decoders`, at most `heads` KV heads each."""
    layers = {}
    for name, spec in data["layers"].items():
        if _decoder(name) in decoders:
            spec = dict(spec)
            if heads is not None and spec.get("num_kv_heads", 1) > heads:
                spec["num_kv_heads"] = heads
                spec.pop("page_size_bytes", None)
            if heads is not None and spec["kind"] == "mamba":
                # Qwen3-Next's states are MiBs a slot: the same shape, smaller.
                spec["state_shapes"] = [[min(d, 16) for d in shape]
                                        for shape in spec["state_shapes"]]
                for key in ("page_size_bytes", "page_size_padded"):
                    spec.pop(key, None)
            layers[name] = spec
    data["layers"] = layers
    device = data["device"]
    if device.get("pipeline_stages"):
        device["pipeline_stages"] = None
    return data


def _quiet(planner: Callable[[PlanRequest], Plan], request: PlanRequest) -> Plan | None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", hp.PlanWarning)
        try:
            return planner(request)
        except hp.PlanError:
            return None


def _smallest(data: dict[str, Any], set_bytes: Callable[[dict[str, Any], int], None],
              planner: Callable[[PlanRequest], Plan], rng: random.Random,
              start: int = MIB // 4) -> tuple[PlanRequest, Plan] | None:
    """The request with the least memory (doubling from `start`) that plans, then up to twice
    that."""
    budget = start
    while budget <= 2**31:
        set_bytes(data, budget)
        request = PlanRequest.model_validate(data)
        if _quiet(planner, request) is not None:
            set_bytes(data, budget + rng.randrange(budget))
            request = PlanRequest.model_validate(data)
            plan = _quiet(planner, request)
            if plan is not None:
                return request, plan
        budget *= 2
    return None


def _vllm_bytes(data: dict[str, Any], budget: int) -> None:
    data["device"]["available_bytes"] = budget


def _stages(data: dict[str, Any], budget: int) -> None:
    names = list(data["layers"])
    half = len(names) // 2
    data["device"]["pipeline_stages"] = [
        {"layers": names[:half], "available_bytes": budget},
        {"layers": names[half:], "available_bytes": budget + budget // 3},
    ]


VLLM_PRESETS: list[tuple[str, set[int], dict[str, Any]]] = [
    ("llama-3-8b", {0, 1}, {}),
    ("llama-3-8b", {0, 1, 2}, {"layout": hp.KVCacheLayout.LHBNC}),
    ("llama-3-8b", {0, 1, 2, 3}, {"layout": hp.KVCacheLayout.BHLNC}),
    ("gemma-3-27b", {0, 5}, {}),
    ("gpt-oss-120b", {0, 1, 2}, {"layout": hp.KVCacheLayout.BLHNC}),
    ("qwen3-next-80b", {0, 3}, {}),
    ("qwen3-next-80b", {0, 1, 3}, {"prefix_caching": False}),
    ("llama-4-scout", {0, 3}, {}),
    ("deepseek-v3.2", {0, 1}, {"hisparse": False}),
    ("deepseek-v3.2", {0, 1, 2}, {"host_pool_bytes": MIB}),
    ("deepseek-v3.2", {0, 1}, {"host_pool_bytes": MIB, "tp": 2}),
    ("glm-5-index-share-4", {0, 1, 2, 3, 4}, {"host_pool_bytes": MIB}),
    ("deepseek-v4-flash", {0, 2, 3}, {"block_size": None}),
]


def vllm_preset_seeds(rng: random.Random) -> list[Seed]:
    seeds = []
    for model, decoders, settings in VLLM_PRESETS:
        arch = load_preset(model).architecture
        length = rng.choice([32, 64, 100, 128])
        chosen = Settings(max_model_len=length, gpu_mem_bytes=MIB,
                          **{"block_size": 16, **settings})
        data = _keep(build_request(arch, chosen).model_dump(mode="json"), decoders, heads=2)
        if data["hisparse"] is not None:
            data["model"]["index_topk"] = rng.choice([16, 32, 64])
        data["scheduler"]["max_num_batched_tokens"] = rng.choice([16, 64, 256])
        found = _smallest(data, _vllm_bytes, hp.plan, rng)
        if found is not None:
            seeds.append(Seed(f"vllm {model} {sorted(decoders)}", *found))
    # Gemma-3n: layers 20 and 24 read layer 18's and 19's caches (cross-layer KV sharing).
    arch = load_config_file(GEMMA3N, use_transformers=False)
    data = _keep(build_request(arch, Settings(max_model_len=64, block_size=16, gpu_mem_bytes=MIB))
                 .model_dump(mode="json"), {0, 4, 18, 19, 20, 24}, heads=2)
    found = _smallest(data, _vllm_bytes, hp.plan, rng)
    if found is not None:
        seeds.append(Seed("vllm gemma-3n [0, 4, 18, 19, 20, 24] shared", *found))
    data = _keep(build_request(load_preset("llama-3-8b").architecture, Settings(
        max_model_len=64, block_size=16)).model_dump(mode="json"), {0, 1, 2, 3}, heads=2)
    data["device"]["available_bytes"] = 0
    found = _smallest(data, _stages, hp.plan, rng)
    if found is not None:
        seeds.append(Seed("vllm llama-3-8b two stages", *found))
    return seeds


SGLANG_PRESETS: list[tuple[str, set[int], dict[str, Any]]] = [
    ("llama-3-8b", {0, 1}, {}),
    ("llama-3-8b", {0}, {"page_size": 16, "kv_cache_dtype": "fp8_e4m3"}),
    ("gemma-3-27b", {0, 5}, {"page_size": 16}),
    ("gpt-oss-120b", {0, 1}, {"page_size": 4}),
    ("qwen3-next-80b", {0, 3}, {}),
    ("qwen3-next-80b", {0, 1, 2, 3}, {"page_size": 16}),
    ("deepseek-v3.2", {0, 1}, {}),
    ("deepseek-v3.2", {0, 1}, {"dsa_backend": "trtllm"}),
    ("deepseek-v4-flash", {0, 1, 2, 3}, {"max_running_requests": 3}),
]


def _sglang_bytes(data: dict[str, Any], budget: int) -> None:
    data["device"]["available_bytes"] = budget


SPEC = {"speculative_draft_num_layers": 1}
TREE = {"speculative_num_steps": 2, "speculative_eagle_topk": 2,
        "speculative_num_draft_tokens": 4}
SGLANG_MODES: list[tuple[str, str, set[int], dict[str, Any], dict[str, int]]] = [
    # (mode, model, decoders, settings, request tweaks: index_topk, window, head_size_v)
    ("hisparse metadata", "deepseek-v3.2", {0, 1},
     {"enable_hisparse": True, "hisparse_top_k": 64}, {"index_topk": 64}),
    ("hisparse metadata, shared-index miss plan", "glm-5-index-share-4", {0, 1, 2, 3, 4},
     {"enable_hisparse": True, "hisparse_top_k": 32}, {"index_topk": 32}),
    ("shared-index placeholders", "glm-5-index-share-4", {0, 1, 2, 3, 4}, {}, {}),
    ("llama-4 window hybrid", "llama-4-scout", {0, 3}, {}, {"window": 16}),
    ("pipeline rank", "llama-3-8b", {0, 1, 2, 3}, {"pp_size": 2, "pp_rank": 1}, {}),
    ("pipeline rank of window layers only", "llama-4-scout", {0, 1, 2, 3},
     {"pp_size": 2, "pp_rank": 0}, {"window": 16}),
    ("pipeline rank, llama-4 full layers", "llama-4-scout", {0, 1, 2, 3},
     {"pp_size": 2, "pp_rank": 1}, {"window": 16}),
    ("pipeline rank with a draft", "llama-3-8b", {0, 1, 2, 3},
     {"pp_size": 2, "pp_rank": 1, "speculative_algorithm": "EAGLE", **SPEC}, {}),
    ("pipeline rank without the draft worker", "llama-3-8b", {0, 1, 2, 3},
     {"pp_size": 2, "pp_rank": 0, "speculative_algorithm": "EAGLE", **SPEC}, {}),
    ("pipeline rank with an MTP draft", "deepseek-v3.2", {0, 1, 2, 3},
     {"pp_size": 2, "pp_rank": 1, "speculative_algorithm": "NEXTN", **SPEC}, {}),
    ("pipeline rank, shared-index placeholders", "glm-5-index-share-4", set(range(8)),
     {"pp_size": 2, "pp_rank": 1}, {}),
    ("radix off, request-capped window pool", "gpt-oss-120b", {0, 1},
     {"disable_radix_cache": True, "max_running_requests": 2, "page_size": 4}, {"window": 16}),
    ("radix off, request-capped window pool with a draft", "gpt-oss-120b", {0, 1},
     {"disable_radix_cache": True, "page_size": 4, "speculative_algorithm": "EAGLE3", **SPEC},
     {"window": 16}),
    ("radix off, one Mamba slot a request", "qwen3-next-80b", {0, 3},
     {"disable_radix_cache": True, "max_running_requests": 2}, {}),
    ("DP attention", "llama-3-8b", {0, 1},
     {"enable_dp_attention": True, "dp_size": 2, "tp_size": 2, "max_running_requests": 6}, {}),
    ("DP attention, Mamba", "qwen3-next-80b", {0, 3},
     {"enable_dp_attention": True, "dp_size": 2, "tp_size": 2, "max_running_requests": 4,
      "disable_radix_cache": True}, {}),
    ("DP attention with a draft", "llama-3-8b", {0, 1},
     {"enable_dp_attention": True, "dp_size": 2, "tp_size": 2, "speculative_algorithm": "EAGLE",
      **SPEC}, {}),
    ("decode context parallelism", "deepseek-v3.2", {0, 1}, {"dcp_size": 2, "tp_size": 2}, {}),
    ("decode context parallelism, shared-index placeholders", "glm-5-index-share-4",
     {0, 1, 2, 3, 4}, {"dcp_size": 2, "tp_size": 2}, {}),
    ("Blackwell, fp8 DSA rows and trtllm pages", "deepseek-v3.2", {0, 1},
     {"compute_capability": [10, 0]}, {}),
    ("Blackwell, trtllm pages of 64", "llama-3-8b", {0, 1}, {"compute_capability": [10, 0]},
     {}),
    ("speculative MTP, DSA draft pools", "deepseek-v3.2", {0, 1},
     {"speculative_algorithm": "NEXTN", **SPEC}, {}),
    ("speculative MTP with HiSparse", "deepseek-v3.2", {0, 1},
     # SGLang's speculative swap wants top_k >= 1024 (targets/sglang/hisparse/speculative.py).
     {"speculative_algorithm": "NEXTN", "enable_hisparse": True, "hisparse_top_k": 1024, **SPEC},
     {"index_topk": 1024}),
    ("speculative MTP with decode context parallelism", "deepseek-v3.2", {0, 1},
     {"speculative_algorithm": "NEXTN", "dcp_size": 2, "tp_size": 2, **SPEC}, {}),
    ("speculative EAGLE, V apart (draft_kv_v)", "llama-3-8b", {0, 1},
     {"speculative_algorithm": "EAGLE", "page_size": 4, **SPEC, **TREE}, {"head_size_v": 64}),
    ("speculative EAGLE, Mamba intermediates (chain)", "qwen3-next-80b", {0, 3},
     {"speculative_algorithm": "EAGLE", **SPEC}, {}),
    ("speculative EAGLE, Mamba intermediates (tree)", "qwen3-next-80b", {0, 3},
     {"speculative_algorithm": "EAGLE", **SPEC, **TREE}, {}),
    ("speculative EAGLE3, window hybrid", "gpt-oss-120b", {0, 1},
     {"speculative_algorithm": "EAGLE3", **SPEC}, {"window": 16}),
    # Drafts of their own shape (issue 36): priced at the target's layer, pooled in their own.
    ("speculative EAGLE, a draft wider than the target", "llama-3-8b", {0, 1},
     {"speculative_algorithm": "EAGLE", **SPEC, "speculative_draft_kv_heads": 8}, {}),
    ("speculative EAGLE, a narrower draft of its own head_dim", "llama-3-8b", {0, 1},
     {"speculative_algorithm": "EAGLE", **SPEC, "speculative_draft_kv_heads": 1,
      "speculative_draft_head_dim": 64}, {}),
    ("speculative EAGLE tree on pages, a wider draft of its own head_dim", "llama-3-8b",
     {0, 1}, {"speculative_algorithm": "EAGLE", "page_size": 4, **SPEC, **TREE,
              "speculative_draft_kv_heads": 4, "speculative_draft_head_dim": 256}, {}),
    ("pipeline rank with a wider draft", "llama-3-8b", {0, 1, 2, 3},
     {"pp_size": 2, "pp_rank": 1, "speculative_algorithm": "EAGLE", **SPEC,
      "speculative_draft_kv_heads": 6}, {}),
    ("DP attention with a wider draft", "llama-3-8b", {0, 1},
     {"enable_dp_attention": True, "dp_size": 2, "tp_size": 2, "speculative_algorithm": "EAGLE",
      **SPEC, "speculative_draft_kv_heads": 3}, {}),
    ("window hybrid with a wider draft", "gpt-oss-120b", {0, 1},
     {"speculative_algorithm": "EAGLE3", **SPEC, "speculative_draft_kv_heads": 4}, {"window": 16}),
]
"""Seeds of SGLang's server modes, each the planner's own plan of a preset cut to a few layers;
`tweaks` shrink what would need a large budget (the indexer's top-k, a window) or give V its
own head size."""


def sglang_seed(name: str, model: str, decoders: set[int], settings: dict[str, Any],
                 tweaks: dict[str, int], rng: random.Random) -> Seed | None:
    arch = load_preset(model).architecture
    context = rng.choice([64, 128, 256])
    engine = SGLangSettings.model_validate({"name": "sglang", "context_length": context,
                                            **settings})
    data = sglang_request(arch, engine, available_bytes=MIB).model_dump(mode="json")
    data = _keep(data, decoders, heads=2)
    if "index_topk" in tweaks:
        data["model"]["index_topk"] = tweaks["index_topk"]
    for spec in data["layers"].values():
        for key in ("sliding_window", "attention_chunk_size"):
            if spec.get(key) and "window" in tweaks:
                spec[key] = min(spec[key], tweaks["window"])
        if spec["kind"] == "full_attention" and "head_size_v" in tweaks:
            spec["head_size_v"] = tweaks["head_size_v"]
            spec.pop("page_size_bytes", None)
    found = _smallest(data, _sglang_bytes, plan_for_engine, rng)
    return None if found is None else Seed(name, *found)


def sglang_preset_seeds(rng: random.Random) -> list[Seed]:
    seeds = [sglang_seed(f"sglang {model} {sorted(decoders)} {settings}", model, decoders,
                          settings, {}, rng) for model, decoders, settings in SGLANG_PRESETS]
    seeds += [sglang_seed(f"sglang {mode}: {model} {sorted(decoders)}", model, decoders,
                           settings, tweaks, rng)
              for mode, model, decoders, settings, tweaks in SGLANG_MODES]
    return [seed for seed in seeds if seed is not None]


# --- random requests ------------------------------------------------------------------------

DTYPES = ["bfloat16", "float16", "float32", "uint8"]


def _attention(rng: random.Random, kind: str, block: int) -> dict[str, Any]:
    spec: dict[str, Any] = {"kind": kind, "block_size": block, "dtype": rng.choice(DTYPES),
                            "num_kv_heads": rng.choice([1, 2]),
                            "head_size": rng.choice([8, 16, 24, 64])}
    if kind == "sliding_window":
        spec["sliding_window"] = rng.choice([8, 32, 100])
    if kind == "chunked_local_attention":
        spec["attention_chunk_size"] = rng.choice([32, 64])
    if kind == "mla":
        spec["num_kv_heads"] = 1
    if kind == "full_attention" and rng.random() < 0.2:
        spec["head_size_v"] = rng.choice([8, 32])
    return spec


def _mamba(rng: random.Random, block: int) -> dict[str, Any]:
    return {"kind": "mamba", "block_size": block,
            "state_shapes": [[rng.choice([2, 4]), rng.choice([8, 16])], [rng.choice([4, 8])]],
            "state_dtypes": [rng.choice(["bfloat16", "float32"]), "float32"]}


def random_vllm_request(rng: random.Random) -> dict[str, Any]:
    block = rng.choice([1, 4, 16])
    kinds = rng.sample(["full_attention", "sliding_window", "chunked_local_attention", "mla",
                        "mamba"], rng.choice([1, 2]))
    palette = [_mamba(rng, block) if kind == "mamba" else _attention(rng, kind, block)
               for kind in kinds]
    layers = {f"model.layers.{i}.attn": rng.choice(palette) for i in range(rng.randint(1, 4))}
    return {
        "layers": layers,
        "model": {"max_model_len": rng.choice([16, 40, 64]),
                  "auto_fit_max_model_len": rng.random() < 0.3},
        "device": {"available_bytes": 0,
                   "kv_cache_layout": rng.choice([layout.value for layout in hp.KVCacheLayout])},
        "scheduler": {"max_num_batched_tokens": rng.choice([8, 32]),
                      "num_prefill_lookahead_tokens": rng.choice([0, 0, 2])},
    }


SGLANG_SHAPES = ("mha", "mla", "window", "mha")


def random_sglang_request(rng: random.Random, shape: str) -> dict[str, Any]:
    layers = {}
    for i in range(rng.randint(1, 3)):
        if shape == "mla":
            layers[f"model.layers.{i}.attn"] = {"kind": "mla", "block_size": 16,
                                               "head_size": rng.choice([96, 576]),
                                               "dtype": "bfloat16"}
        elif shape == "window" and i % 2 == 0:
            layers[f"model.layers.{i}.attn"] = _attention(rng, "sliding_window", 16)
        else:
            layers[f"model.layers.{i}.attn"] = _attention(rng, "full_attention", 16)
    if shape == "window":
        layers["model.layers.9.attn"] = _attention(rng, "full_attention", 16)
    context = rng.choice([16, 48, 64])
    engine: dict[str, Any] = {"name": "sglang", "context_length": context,
                              "page_size": rng.choice([1, 4, 16])}
    if rng.random() < 0.5:
        engine["max_running_requests"] = rng.randint(1, 8)
    if rng.random() < 0.3:
        engine["kv_cache_dtype"] = "fp8_e4m3"
    if shape == "window" and rng.random() < 0.5:
        engine["swa_full_tokens_ratio"] = rng.choice([0.5, 1.0, 1.5])
    return {"layers": layers, "model": {"max_model_len": context},
            "device": {"available_bytes": 0}, "engine": engine}


def random_seeds(rng: random.Random, count: int, engine: str) -> list[Seed]:
    seeds: list[Seed] = []
    tries = 0
    planner: Callable[[PlanRequest], Plan]
    while len(seeds) < count and tries < 20 * count:
        tries += 1
        if engine == "vllm":
            data, planner = random_vllm_request(rng), hp.plan
        else:
            shape = SGLANG_SHAPES[len(seeds) % len(SGLANG_SHAPES)]
            data, planner = random_sglang_request(rng, shape), plan_for_engine
        found = _smallest(data, _vllm_bytes, planner, rng, start=MIB // 64)
        if found is not None:
            seeds.append(Seed(f"{engine} random {len(seeds)}", *found))
    return seeds


def seeds_for(engine: str, rng: random.Random, randoms: int) -> list[Seed]:
    presets = vllm_preset_seeds(rng) if engine == "vllm" else sglang_preset_seeds(rng)
    return presets + random_seeds(rng, randoms, engine)
