"""Seed pairs of instances for the pattern-edit fuzzer (pattern_edit_fuzz): both engines, TP
either way, block and page sizes, layouts, HiSparse host pools, Mamba states, pipeline
stages, chunked-local layers, and the shapes that beat the probe proof: windows shorter than a
period (gpt-oss-120b's 128-token window between vLLM block 16 and block 256; SGLang page 64
to page 16 with a 40-token window), tables that share a pool (vLLM's window and full groups),
and pools of a few blocks (Llama-3-8B block 16 to 64, 8-block pools). Small: a few
layers each, so that every request runs through the reference executor in milliseconds."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import hisparse_plan as hp
from hisparse_plan.exchange.transfer import Instance
from hisparse_plan.presets import Settings, build_request, load_preset
from support.transfer_strategies import CONV, HEADS, mamba_spec
from support.transfer_support import (
    StateCuts,
    attention_layers,
    deepseek_plan,
    plan_of,
    sglang_plan,
    sglang_request,
    vllm_plan,
    vllm_request,
    vllm_stages,
)

WINDOW_LAYER = "model.layers.0.self_attn.attn"


@dataclass(frozen=True)
class SeedPair:
    name: str
    source: Instance
    destination: Instance
    tokens: tuple[int, ...]
    """num_tokens the fuzzer's requests take (each residue class the shape has: inside and
    past windows and chunks, first and last partial blocks), where the pools hold them."""
    states: StateCuts | None = None
    """How the pair's states are sharded (the oracle's encoding of the full state)."""


def _preset(preset: str, layers: int, blocks: int | None, **settings: Any) -> hp.KVCachePlan:
    """A preset's first decoder layers, its pool of `blocks` blocks when given."""
    request = build_request(load_preset(preset).architecture, Settings(**settings))
    data = request.model_dump(mode="json")
    keep = tuple(f"model.layers.{i}." for i in range(layers))
    data["layers"] = {name: spec for name, spec in data["layers"].items()
                      if name.startswith(keep)}
    if blocks is not None:
        data["device"]["num_blocks_override"] = blocks
        data["device"]["available_bytes"] = 2**40
    plan = hp.plan(hp.PlanRequest.model_validate(data))
    assert isinstance(plan, hp.KVCachePlan)
    return plan


def gpt_oss_window() -> SeedPair:
    def side(block: int, blocks: int) -> Instance:
        return Instance([_preset("gpt-oss-120b", 2, blocks, block_size=block,
                                 max_model_len=512)])
    return SeedPair("gpt-oss-120b window 128: vLLM block 16 -> block 256", side(16, 72),
                    side(256, 6), (1, 100, 127, 128, 129, 200, 255, 256, 257, 300, 383, 400,
                                   511))


def sglang_window() -> SeedPair:
    layers = attention_layers(1, 2, window=40) | attention_layers(1, 2, first=1)

    def side(page: int) -> Instance:
        plan = sglang_plan({k: v | {"block_size": page} for k, v in layers.items()},
                           page=page, tokens=512, context_length=256)
        return Instance([plan], windows={WINDOW_LAYER: 40})
    return SeedPair("SGLang page 64 -> page 16, 40-token window", side(64), side(16),
                    (1, 16, 39, 40, 41, 63, 64, 65, 100, 128, 129, 200, 255))


def llama_small_pool() -> SeedPair:
    def side(block: int) -> Instance:
        return Instance([_preset("llama-3-8b", 1, 8, block_size=block, max_model_len=112)])
    return SeedPair("Llama-3-8B block 16 -> 64, pools of 8 blocks", side(16), side(64),
                    (1, 15, 16, 17, 63, 64, 65, 100, 112))


def shared_small_pool() -> SeedPair:
    layers = attention_layers(1, 2, window=40) | attention_layers(1, 2, first=1)

    def side(block: int, blocks: int, layout: str) -> Instance:
        specs = {k: v | {"block_size": block} for k, v in layers.items()}
        return Instance([vllm_plan(specs, layout=layout, blocks=blocks, max_model_len=128)])
    return SeedPair("vLLM window + full groups sharing a pool: block 16 -> 64, 8 blocks",
                    side(16, 40, "BLNHC"), side(64, 8, "LBHNC"),
                    (1, 20, 39, 40, 41, 64, 65, 100, 127, 128))


def _deepseek(engine: str, hisparse: bool, host: str = "layer_outermost") -> Callable[
        [], SeedPair]:
    def made() -> SeedPair:
        src = Instance([deepseek_plan(hisparse=False, layers=1, blocks=20)])
        dst_plan = deepseek_plan(engine=engine, hisparse=hisparse, layers=1, blocks=20,
                                 hisparse_bytes=(2**21, 2**23), host_layout=host)
        fp8 = "fp8_e4m3" if engine == "sglang" else None
        name = f"DeepSeek-V3.2 vLLM -> {engine}{' HiSparse' if hisparse else ''}" + (
            f" ({host} host pool)" if hisparse and engine == "vllm" else "")
        return SeedPair(name, src, Instance([dst_plan], cache_dtype=fp8),
                        (1, 63, 64, 65, 200, 300))
    return made


def _dense_tp(src_tp: int, dst_tp: int, engines: tuple[str, str]) -> Callable[[], SeedPair]:
    def made() -> SeedPair:
        sides = []
        for engine, tp, layout, unit in zip(engines, (src_tp, dst_tp), ("BLNHC", "LBHNC"),
                                            (16, 32), strict=True):
            layers = attention_layers(2, 4 // tp, block=unit)
            plan = (sglang_plan(layers, page=unit, tokens=512) if engine == "sglang"
                    else vllm_plan(layers, layout=layout, blocks=24))
            sides.append(Instance([plan] * tp, total_kv_heads=4))
        return SeedPair(f"{engines[0]} TP {src_tp} -> {engines[1]} TP {dst_tp}", sides[0],
                        sides[1], (1, 15, 16, 33, 64, 100, 200))
    return made


def _sglang_page_one() -> SeedPair:
    layers = attention_layers(1, 2)
    src = Instance([sglang_plan(layers, page=1, tokens=512)])
    dst = Instance([vllm_plan(attention_layers(1, 2, block=16), layout="BHLNC", blocks=24)])
    return SeedPair("SGLang page 1 -> vLLM block 16 BHLNC", src, dst, (1, 15, 16, 17, 100))


def _chunked() -> SeedPair:
    chunked = {"kind": "chunked_local_attention", "block_size": 16, "num_kv_heads": 2,
               "head_size": 16, "dtype": "bfloat16", "attention_chunk_size": 48}
    layers = {WINDOW_LAYER: chunked} | attention_layers(1, 2, first=1)
    src = Instance([vllm_plan(layers, layout="BLNHC", blocks=40)])
    dst = Instance([vllm_plan({k: v | {"block_size": 32} for k, v in layers.items()},
                              layout="LBHNC", blocks=24)])
    return SeedPair("vLLM chunked-local 48: block 16 -> 32", src, dst,
                    (1, 47, 48, 49, 95, 96, 100, 150, 200))


def _mamba() -> SeedPair:
    sides = []
    for index, tp in enumerate((2, 1)):
        layers = {f"model.layers.{i}.linear_attn": mamba_spec(tp, 16) for i in range(1)} | (
            attention_layers(1, 4 // tp, block=16, first=1))
        request = vllm_request(layers, layout="BLHNC", available=2**40, max_model_len=256)
        request["device"]["num_blocks_override"] = 24
        sides.append(Instance([plan_of(request)] * tp, total_kv_heads=4,
                              state_groups=CONV if index == 0 else None))
    return SeedPair("vLLM Mamba states TP 2 -> TP 1", sides[0], sides[1], (1, 16, 100),
                    {0: (1, CONV), 1: (0, (HEADS,))})


def _pipeline() -> SeedPair:
    src = vllm_stages(2, 1, layers=2, heads=2, block=16)
    specs = attention_layers(2, 1, block=64)
    plans = [plan_of(sglang_request(specs, page_size=64, tokens=512, context_length=512,
                                    available=2**30))] * 2
    return SeedPair("vLLM PP 2 -> SGLang TP 2, page 64", src,
                    Instance(plans, total_kv_heads=2), (1, 64, 65, 200))


def _sglang_few_pages() -> SeedPair:
    layers = attention_layers(1, 2)
    src = Instance([vllm_plan(attention_layers(1, 2, block=32), layout="LHBNC", blocks=24)])
    dst = Instance([sglang_plan(layers | {}, page=64, tokens=256, context_length=128)])
    return SeedPair("vLLM block 32 LHBNC -> SGLang page 64, 4 pages", src, dst,
                    (1, 31, 32, 33, 64, 65, 100, 128))


SEEDS: tuple[Callable[[], SeedPair], ...] = (
    gpt_oss_window, sglang_window, llama_small_pool, shared_small_pool,
    _deepseek("vllm", True), _deepseek("vllm", True, "block_outermost"),
    _deepseek("sglang", False), _dense_tp(2, 1, ("vllm", "vllm")),
    _dense_tp(1, 2, ("sglang", "vllm")), _sglang_page_one, _chunked, _mamba, _pipeline,
    _sglang_few_pages,
)


@cache
def seed_pairs() -> tuple[SeedPair, ...]:
    return tuple(make() for make in SEEDS)
