"""hisparse_plan.adapters.sglang on real plans: the reference report (pools, buffers with
layer ids and storages), requests from SGLang's server arguments, pool kwargs for SGLang's
classes, and SGLang's default mem_fraction_static. SGLang itself is not imported."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from hisparse_plan.adapters.sglang import (
    layer_id,
    pool_kwargs,
    report_for_case,
    request_from_server_args,
)
from hisparse_plan.errors import PlanError
from hisparse_plan.targets.sglang import plan_sglang
from support import paths

CONFIGS = paths.HF_CONFIGS
DSV32 = str(CONFIGS / "deepseek-v3.2-exp" / "config.json")
LLAMA = str(CONFIGS / "llama-3.1-8b-instruct" / "config.json")
GPT_OSS = str(CONFIGS / "gpt-oss-120b" / "config.json")
QWEN_NEXT = str(CONFIGS / "qwen3-next-80b-a3b-instruct" / "config.json")
H200 = {"pre_model_load_free_bytes": 149250113536, "post_weights_free_bytes": 63350767616}
DSV32_TP8 = {"tp_size": 8, "context_length": 8192, "mem_fraction_static": 0.9,
             "kv_cache_dtype": "fp8_e4m3", "dsa_backend": "flashmla_kv"}


def case(config: str, memory: dict[str, Any], **server_args: Any) -> dict[str, Any]:
    return {"config": config, "server_args": server_args, "memory": memory}


def pool(rep: dict[str, Any], name: str) -> dict[str, Any]:
    return next(p for p in rep["pools"] if p["name"] == name)


def test_dsv32_tp8_matches_sglang_reference() -> None:
    """SGLang 0.5.23's own figures for DeepSeek-V3.2 on 8 x H200, fp8, flashmla_kv."""
    rep = report_for_case(case(DSV32, H200, **DSV32_TP8))
    assert (rep["page_size"], rep["max_total_num_tokens"], rep["max_running_requests"],
            rep["cell_size_bytes"], rep["available_bytes"]) == (
        64, 1007424, 4096, 48068, 48425756262)
    assert rep["req_to_token"] == {"shape": [4097, 8196], "dtype": "int32"}
    assert [p["name"] for p in rep["pools"]] == ["index", "kv"]
    kv = pool(rep, "kv")
    assert (kv["location"], kv["tokens"], len(kv["buffers"])) == ("device", 1007424, 61)
    assert kv["buffers"][0] == {
        "layer": 0, "name": "kv_buffer", "dtype": "uint8", "shape": [1007488, 1, 656],
        "strides": [656, 656, 1], "storage_offset": 0, "storage_nbytes": 660912128,
        "storage": "kv/0"}
    index = pool(rep, "index")
    assert index["buffers"][60]["layer"] == 60
    assert index["buffers"][0]["shape"] == [15742, 8448]
    assert index["buffers"][0]["storage_nbytes"] == 132988416


def test_dsv32_hisparse_host_pool() -> None:
    rep = report_for_case(case(DSV32, H200, **DSV32_TP8, enable_hisparse=True,
                               hisparse_config={"top_k": 2048, "device_buffer_size": 4096,
                                                "host_to_device_ratio": 2}))
    assert (rep["max_total_num_tokens"], rep["cell_size_bytes"]) == (862848, 56120)
    host = pool(rep, "hisparse_host")
    assert (host["location"], host["tokens"]) == ("host", 1725760)
    assert host["buffers"] == [{
        "layer": None, "name": "host_kv_buffer", "dtype": "uint8",
        "shape": [61, 1725760, 1, 656], "strides": [1132098560, 656, 656, 1],
        "storage_offset": 0, "storage_nbytes": 69058012160, "storage": "hisparse_host/0"}]
    assert pool(rep, "index")["tokens"] == 1725696


def test_mha_k_and_v_share_each_layers_storage() -> None:
    rep = report_for_case(case(LLAMA, {"available_bytes": 1073754169}, tp_size=1,
                               context_length=4096, page_size=64, kv_cache_dtype="fp8_e4m3"))
    assert (rep["max_total_num_tokens"], rep["max_running_requests"]) == (16384, 2048)
    kv = pool(rep, "kv")
    k0, v0 = kv["buffers"][0], kv["buffers"][1]
    assert (k0["name"], v0["name"], k0["layer"], v0["layer"]) == ("k_buffer", "v_buffer", 0, 0)
    assert k0["storage"] == v0["storage"] == "kv/0"
    assert v0["storage_offset"] == 16448 * 8 * 128
    assert kv["buffers"][-1]["storage"] == "kv/31"


def test_window_model_layer_ids_split_between_pools() -> None:
    rep = report_for_case(case(GPT_OSS, {"available_bytes": 2 * 2**30}, tp_size=1,
                               context_length=4096, swa_full_tokens_ratio=0.5))
    assert (rep["max_total_num_tokens"], rep["cell_size_bytes"]) == (38836, 55296)
    full, swa = pool(rep, "kv"), pool(rep, "swa")
    assert {b["layer"] for b in full["buffers"]} == set(range(1, 36, 2))
    assert {b["layer"] for b in swa["buffers"]} == set(range(0, 36, 2))
    assert swa["tokens"] == 19418


def test_refusals_are_error_entries() -> None:
    assert "enable_hisparse" in report_for_case(case(
        LLAMA, {"available_bytes": 2**30}, tp_size=1, enable_hisparse=True))["error"]
    bad = report_for_case(case(LLAMA, {"available_bytes": 2**30}, tp_size=1, bogus=1))
    assert "server_args.bogus" in bad["error"]
    assert "memory" in report_for_case({"config": LLAMA, "server_args": {}})["error"]


def test_server_args_map_onto_settings() -> None:
    request = request_from_server_args(LLAMA, {"tp_size": 8, "page_size": 16}, {
        "available_bytes": 2**30})
    assert request.engine is not None
    assert (request.engine.page_size, request.engine.context_length) == (16, 131072)
    assert request.device.available_bytes == 2**30
    with pytest.raises(PlanError, match=r"hisparse_config\.nope"):
        request_from_server_args(DSV32, {"hisparse_config": '{"nope": 1}'}, H200)
    with pytest.raises(PlanError, match="tp_size"):
        request_from_server_args(LLAMA, {"tp_size": 0}, {"available_bytes": 2**30})


def test_layer_ids_from_names() -> None:
    assert layer_id("model.layers.7.self_attn.indexer.k_cache", 0) == 7
    assert layer_id("language_model.model.layers.12.attn", 0) == 12
    assert layer_id("blocks.3.mixer", 9) == 3
    assert layer_id("attn", 9) == 9


def _plan(config: str, memory: dict[str, Any], **server_args: Any) -> Any:
    return plan_sglang(request_from_server_args(config, server_args, memory))


def test_pool_kwargs_mha() -> None:
    plan = _plan(LLAMA, {"available_bytes": 1073754169}, tp_size=1, context_length=4096,
                 page_size=64, kv_cache_dtype="fp8_e4m3")
    kwargs = pool_kwargs(plan)
    assert kwargs["kv"] == {
        "class": "MHATokenToKVPool", "size": 16384, "page_size": 64,
        "dtype": "float8_e4m3fn", "head_num": 8, "head_dim": 128, "v_head_dim": 128,
        "layer_num": 32}
    assert kwargs["req_to_token"] == {"class": "ReqToTokenPool", "size": 2048,
                                      "max_context_len": 4100}
    assert pool_kwargs(plan, fp8="float8_e5m2")["kv"]["dtype"] == "float8_e5m2"


def test_pool_kwargs_dsa_and_hisparse() -> None:
    plan = _plan(DSV32, H200, **DSV32_TP8)
    assert pool_kwargs(plan)["kv"] == {
        "class": "DSATokenToKVPool", "size": 1007424, "page_size": 64, "kv_lora_rank": 512,
        "dtype": "float8_e4m3fn", "qk_rope_head_dim": 64, "layer_num": 61,
        "index_head_dim": 128, "kv_cache_dim": 656}
    raw = pool_kwargs(_plan(DSV32, H200, **{**DSV32_TP8, "dsa_backend": "trtllm"}))["kv"]
    assert (raw["kv_lora_rank"], raw["kv_cache_dim"]) == (512, 576)
    hisparse = pool_kwargs(_plan(DSV32, H200, **DSV32_TP8, enable_hisparse=True))["kv"]
    assert (hisparse["class"], hisparse["host_to_device_ratio"]) == (
        "HiSparseDSATokenToKVPool", 2)


def test_pool_kwargs_window_and_mamba() -> None:
    swa = pool_kwargs(_plan(GPT_OSS, {"available_bytes": 2 * 2**30}, tp_size=1,
                            context_length=4096, swa_full_tokens_ratio=0.5))["kv"]
    assert (swa["class"], swa["size"], swa["size_swa"], swa["head_num"], swa["head_dim"]) == (
        "SWAKVPool", 38836, 19418, 8, 64)
    assert swa["full_attention_layer_ids"] == list(range(1, 36, 2))
    hybrid = pool_kwargs(_plan(QWEN_NEXT, {"available_bytes": 4 * 2**30}, tp_size=1,
                               context_length=4096, max_mamba_cache_size=30))
    assert hybrid["kv"]["class"] == "MHATokenToKVPool"
    assert hybrid["kv"]["layer_num"] == 12
    mamba = hybrid["mamba"]
    assert (mamba["size"], mamba["conv_state_shape"], mamba["ssm_dtype"]) == (
        30, [8192, 3], "float32")
    assert mamba["mamba_layer_ids"][:3] == [0, 1, 2]


def test_adapter_never_imports_sglang() -> None:
    assert "sglang" not in sys.modules
