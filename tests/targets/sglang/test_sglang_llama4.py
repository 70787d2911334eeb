"""Llama-4 as SGLang 0.5.23 serves it (issue 26): Llama4ForConditionalGeneration is a window
hybrid whose layers SGLang lays out by position (every 4th full, the rest in the window pool),
the window the chunk size (or a sliding_window key); Llama4ForCausalLM keeps one full pool.

Every pinned number was computed by SGLang's own code (ServerArgs -> ModelConfig ->
KVCacheConfigurator.configure on device=meta):

    PYTHONPATH=references/sglang_stubs:references /work/sglang/bin/python \\
        references/sglang_reference.py CASE.json

with the case each test builds (`case(...)` below is that JSON: TP 8, context 8192,
mem_fraction_static 0.88, a 40 GiB budget)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

import hisparse_plan as hp
from hisparse_plan.adapters.sglang import (
    report,
    report_for_case,
    request_from_server_args,
    sglang_request,
)
from hisparse_plan.errors import UnsupportedRequestError
from hisparse_plan.models.sglang_settings import SGLangSettings
from hisparse_plan.presets import load_preset
from hisparse_plan.targets.sglang import plan_sglang
from support import paths

GIB = 1 << 30
SCOUT = paths.HF_CONFIGS / "llama-4-scout-17b-16e-instruct"
H200, B200 = [9, 0], [10, 0]


def scout(**text: Any) -> dict[str, Any]:
    """Llama-4-Scout's config.json, its text_config updated with `text`."""
    config: dict[str, Any] = json.loads((SCOUT / "config.json").read_text())
    config = copy.deepcopy(config)
    config["text_config"].update(text)
    return config


def case(config: dict[str, Any], capability: list[int] = H200, **args: Any) -> dict[str, Any]:
    return {"config": config, "gpu": {"capability": capability},
            "server_args": {"context_length": 8192, "mem_fraction_static": 0.88, "tp_size": 8,
                            **args},
            "memory": {"available_bytes": 40 * GIB}}


def planned(config: dict[str, Any], capability: list[int] = H200, **args: Any) -> dict[str, Any]:
    report = report_for_case(case(config, capability, **args))
    assert "error" not in report, report.get("error")
    return report


def figures(report: dict[str, Any]) -> tuple[Any, ...]:
    """Tokens, cell, page, max_running_requests, then each pool's name, tokens and layers."""
    pools = tuple((p["name"], p["tokens"], tuple(sorted({b["layer"] for b in p["buffers"]})))
                  for p in report["pools"])
    return (report["max_total_num_tokens"], report["cell_size_bytes"], report["page_size"],
            report["max_running_requests"], pools)


def swa_tokens(plan: Any) -> int:
    tokens: int = next(p["tokens"] for p in report(plan)["pools"] if p["name"] == "swa")
    return tokens


FULL = tuple(range(3, 48, 4))
WINDOW = tuple(i for i in range(48) if (i + 1) % 4)


@pytest.mark.parametrize(("capability", "args", "expected"), [
    # SGLang: HybridSWAPoolConfigurator, SWAKVPool (12 full layers, 36 window layers).
    (H200, {}, (2_056_031, 20889.6, 1, 4096,
                (("kv", 2_056_031, FULL), ("swa", 1_644_824, WINDOW)))),
    # SM100: trtllm_mha attention, pages of 64.
    (B200, {}, (2_056_000, 20889.6, 64, 4096,
                (("kv", 2_056_000, FULL), ("swa", 1_644_800, WINDOW)))),
    # SWARequestCapPoolConfigurator: 8 requests x (8192 + 128 + 2 pages) + 2 chunks + a page.
    (H200, {"disable_radix_cache": True, "max_running_requests": 8},
     (6_766_199, 20889.6, 1, 8, (("kv", 6_766_199, FULL), ("swa", 74_769, WINDOW)))),
])
def test_scout_window_hybrid(capability: list[int], args: dict[str, Any],
                             expected: tuple[Any, ...]) -> None:
    assert figures(planned(scout(), capability, **args)) == expected


def test_scout_layers_by_position_not_no_rope_layers() -> None:
    """SGLang's get_hybrid_layer_ids ignores no_rope_layers: the same pools as the default."""
    report = planned(scout(no_rope_layers=[1, 0] * 24))
    assert figures(report) == figures(planned(scout()))


def test_a_sliding_window_key_is_the_window() -> None:
    """ModelConfig reads sliding_window before attention_chunk_size: a 512-token window caps
    the radix-off window pool at 8 x (512 + 128 + 2) + 8193 = 13,329 tokens."""
    report = planned(scout(sliding_window=512), disable_radix_cache=True,
                     max_running_requests=8)
    assert figures(report)[:2] == (6_950_519, 20889.6)
    assert report["pools"][1]["tokens"] == 13_329


def test_llama4_for_causal_lm_keeps_one_full_pool() -> None:
    """Not one of SGLang's window hybrids: DefaultPoolConfigurator, 48 layers in one pool (less
    the 100 MB multimodal reserve its text_config brings)."""
    config = scout()
    config["architectures"] = ["Llama4ForCausalLM"]
    report = planned(config)
    assert figures(report)[:4] == (1_743_360, 24576, 1, 4096)
    assert [p["name"] for p in report["pools"]] == ["kv"]


def test_fewer_than_four_layers_is_refused() -> None:
    """SGLang builds an all-window pool for 1-3 layers (27,962,026 tokens for 3); the planner
    does not plan window-only models, and says so."""
    report = report_for_case(case(scout(num_hidden_layers=3)))
    assert "no full-attention layer" in report["error"]


def test_scout_plan_checks_against_its_request() -> None:
    request = request_from_server_args(scout(), case(scout())["server_args"],
                                       {"available_bytes": 40 * GIB}, gpu={"capability": H200})
    plan = plan_sglang(request)
    hp.check_plan(plan, request=request)
    assert (plan.max_total_num_tokens, swa_tokens(plan)) == (2_056_031, 1_644_824)


def test_the_preset_plans_as_the_config() -> None:
    """The llama-4-scout preset (its text_config, no architecture): chunked layers in the
    window pool, SGLang's figures for the config."""
    engine = SGLangSettings.model_validate({"name": "sglang", "context_length": 8192,
                                            "mem_fraction_static": 0.88})
    request = sglang_request(load_preset("llama-4-scout").architecture, engine, tp=8,
                             available_bytes=40 * GIB)
    plan = plan_sglang(request)
    hp.check_plan(plan, request=request)
    assert (plan.max_total_num_tokens, swa_tokens(plan)) == (2_056_031, 1_644_824)


def test_differing_chunks_are_refused() -> None:
    engine = SGLangSettings.model_validate({"name": "sglang", "context_length": 8192})
    request = sglang_request(load_preset("llama-4-scout").architecture, engine, tp=8,
                             available_bytes=40 * GIB)
    data = request.model_dump(mode="json")
    name = next(n for n, s in data["layers"].items() if s["kind"] == "chunked_local_attention")
    data["layers"][name]["attention_chunk_size"] = 4096
    with pytest.raises(UnsupportedRequestError, match="attention_chunk_size"):
        plan_sglang(type(request).model_validate(data))


def test_a_capped_window_pool_in_no_whole_pages_is_sglangs() -> None:
    """Radix cache off, 8 requests, pages of 16, max_total_tokens 50,007 below the request cap:
    SGLang 0.5.23 (SWARequestCapPoolConfigurator.calculate_pool_sizes_from_max_tokens) floors
    the full pool to 50,000 tokens and keeps the window pool at the 50,007 given; its K and V
    are [50023, 1, 128] halves of one allocation rounded up to 50,032 rows (V from element
    6,404,096, 25,616,384 bytes a layer). The plan is SGLang's, and check_plan takes the 7 K
    rows past the last whole page (the allocator's 3,125 pages and page 0) as spare rows."""
    args: dict[str, Any] = {"page_size": 16, "disable_radix_cache": True,
                            "max_running_requests": 8, "max_total_tokens": 50_007}
    got = planned(scout(), **args)
    assert got["max_total_num_tokens"] == 50_000
    assert [(p["name"], p["tokens"], p["buffers"][1]["shape"], p["buffers"][1]["storage_offset"],
             p["buffers"][1]["storage_nbytes"]) for p in got["pools"]] == [
        ("kv", 50_000, [50_016, 1, 128], 6_402_048, 25_608_192),
        ("swa", 50_007, [50_023, 1, 128], 6_404_096, 25_616_384)]
    request = request_from_server_args(scout(), case(scout(), **args)["server_args"],
                                       {"available_bytes": 40 * GIB}, gpu={"capability": H200})
    plan = plan_sglang(request)
    hp.check_plan(plan, request=request)
    swa = next(pool for pool in plan.pools if pool.name == "swa")
    assert swa.num_blocks == 50_007 // 16 + 1


def test_a_drafts_capped_window_pool_is_sglangs() -> None:
    """sglang_diff seed 2 case 79 on an H200 (llama4-2-79): a 30-layer Scout drafting with its
    own checkpoint (EAGLE), DP attention over 2 groups, fp8, pages of 64, the radix cache off,
    max_total_tokens 51,859. SGLang 0.5.23 (sglang_diff --dump): the full pools 51,840 tokens
    (rows [51904, 1, 64]), the target's and the draft's window pools 51,859 (rows
    [51923, 1, 64], V from element 3,325,952, 6,651,904 bytes a layer), 32 requests."""
    config = scout(num_attention_heads=4, num_hidden_layers=30, interleave_moe_layer_step=2,
                   num_key_value_heads=4, head_dim=64, max_position_embeddings=1_048_576,
                   num_local_experts=128)
    got = report_for_case({
        "config": config, "gpu": {"capability": H200},
        "server_args": {"tp_size": 8, "context_length": 2048, "mem_fraction_static": 0.9,
                        "max_total_tokens": 51_859, "dp_size": 2, "enable_dp_attention": True,
                        "disable_radix_cache": True, "max_running_requests": 64,
                        "kv_cache_dtype": "fp8_e4m3", "swa_full_tokens_ratio": 0.8,
                        "page_size": 64, "speculative_algorithm": "EAGLE",
                        "speculative_draft_model_path": "@model"},
        "memory": {"pre_model_load_free_bytes": 149_250_113_536,
                   "post_weights_free_bytes": 117_037_858_816}})
    assert "error" not in got, got.get("error")
    assert (got["max_total_num_tokens"], got["max_running_requests"]) == (51_840, 32)
    for pools in (got["pools"], got["draft_pools"]):
        assert [(p["name"], p["tokens"], p["buffers"][1]["shape"],
                 p["buffers"][1]["storage_offset"], p["buffers"][1]["storage_nbytes"])
                for p in pools] == [
            ("kv", 51_840, [51_904, 1, 64], 3_321_856, 6_643_712),
            ("swa", 51_859, [51_923, 1, 64], 3_325_952, 6_651_904)]
