"""SGLang 0.5.23's own figures for the models and GPUs its defaults treat apart (issue 26):
Gemma-2/3 in one full pool, Blackwell's fp8 DSA rows and trtllm pages, MiniMax-M2, HiSparse's
top-k, the configs SGLang refuses to load and the longer-context guard.

Every pinned number was computed by SGLang's own code (ServerArgs -> ModelConfig ->
KVCacheConfigurator.configure on device=meta):

    PYTHONPATH=references/sglang_stubs:references /work/sglang/bin/python \\
        references/sglang_reference.py CASE.json

with the case each test builds (`case(...)` below is that JSON)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hisparse_plan.adapters.sglang import report_for_case, request_from_server_args
from hisparse_plan.errors import UnsupportedRequestError
from hisparse_plan.targets.sglang import plan_sglang
from hisparse_plan.targets.sglang.served.architectures import HYBRID_SWA_ARCHITECTURES
from hisparse_plan.targets.sglang.served.hf_config import read_sglang_config
from hisparse_plan.targets.sglang.served.registry import SERVED_ARCHITECTURES
from support import paths
from support.cli_support import Run

GIB = 1 << 30
FIXTURES = paths.HF_CONFIGS
B200, H200 = [10, 0], [9, 0]


def fixture(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((FIXTURES / name / "config.json").read_text())
    return loaded


def case(config: dict[str, Any], capability: list[int] | None = None,
         **server_args: Any) -> dict[str, Any]:
    """A reference case at a 40 GiB budget, mem_fraction_static 0.88, context 8192."""
    args = {"context_length": 8192, "mem_fraction_static": 0.88, **server_args}
    out: dict[str, Any] = {"config": config, "server_args": args,
                           "memory": {"available_bytes": 40 * GIB}}
    if capability is not None:
        out["gpu"] = {"capability": capability}
    return out


def planned(config: dict[str, Any], capability: list[int] | None = None,
            **server_args: Any) -> dict[str, Any]:
    report = report_for_case(case(config, capability, **server_args))
    assert "error" not in report, report.get("error")
    return report


def pool(report: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(p for p in report["pools"] if p["name"] == name)
    return found


def minimax_m2() -> dict[str, Any]:
    """MiniMax-M2's config.json, its cache-shaping fields (62 layers, 8 kv heads x 128, every
    attn_type_list entry 1: full attention)."""
    return {
        "architectures": ["MiniMaxM2ForCausalLM"], "model_type": "minimax_m2",
        "hidden_size": 3072, "num_hidden_layers": 62, "num_attention_heads": 48,
        "num_key_value_heads": 8, "head_dim": 128, "attn_type_list": [1] * 62,
        "max_position_embeddings": 196608, "intermediate_size": 1536,
        "num_local_experts": 256, "num_experts_per_tok": 8, "vocab_size": 200064,
        "rotary_dim": 64, "rope_theta": 5000000, "torch_dtype": "bfloat16",
    }


# --- Gemma-2 and Gemma-3: one full MHATokenToKVPool over every layer -----------------------


@pytest.mark.parametrize(("name", "layers", "tokens", "cell"), [
    ("gemma-3-27b-it", 62, 84_562, 507_904),  # SGLang: MHATokenToKVPool, 124 buffers
    ("gemma-2-9b-it", 42, 124_830, 344_064),
])
def test_gemma_window_layers_share_the_full_pool(
    name: str, layers: int, tokens: int, cell: int
) -> None:
    report = planned(fixture(name))
    assert [p["name"] for p in report["pools"]] == ["kv"]
    assert report["max_total_num_tokens"] == tokens
    assert report["cell_size_bytes"] == cell
    assert len(pool(report, "kv")["buffers"]) == 2 * layers  # K and V of every layer


def test_gpt_oss_keeps_its_window_pool() -> None:
    assert "GptOssForCausalLM" in HYBRID_SWA_ARCHITECTURES
    assert "Gemma3ForConditionalGeneration" not in HYBRID_SWA_ARCHITECTURES
    report = planned(fixture("gpt-oss-20b"))
    assert [p["name"] for p in report["pools"]] == ["kv", "swa"]


# --- Blackwell (SM100) --------------------------------------------------------------------


def test_deepseek_v32_tp8_on_b200_caches_fp8_raw_rows() -> None:
    # SGLang: kv auto -> fp8_e4m3 on SM100, DSA backends trtllm/trtllm, 576-byte rows.
    report = planned(fixture("deepseek-v3.2-exp"), B200, tp_size=8)
    assert report["page_size"] == 64
    assert report["cell_size_bytes"] == 43_188  # 61 x (576 + 132)
    assert report["max_total_num_tokens"] == 994_432
    kv = pool(report, "kv")["buffers"][0]
    assert (kv["dtype"], kv["shape"]) == ("uint8", [994_496, 1, 576])


def test_deepseek_v32_tp8_on_h200_keeps_bfloat16() -> None:
    report = planned(fixture("deepseek-v3.2-exp"), H200, tp_size=8)
    assert (report["cell_size_bytes"], report["max_total_num_tokens"]) == (78_324, 548_352)
    assert pool(report, "kv")["buffers"][0]["dtype"] == "bfloat16"


def test_deepseek_v32_hisparse_on_b200_packs_flashmla_rows() -> None:
    # SGLang: HiSparse picks flashmla_kv for fp8, the packed 656-byte row.
    report = planned(fixture("deepseek-v3.2-exp"), B200, tp_size=8, enable_hisparse=True)
    assert (report["cell_size_bytes"], report["max_total_num_tokens"]) == (56_120, 765_312)
    assert pool(report, "kv")["buffers"][0]["shape"] == [765_376, 1, 656]


def test_glm5_on_b200() -> None:
    report = planned(fixture("glm-5"), B200, tp_size=8)
    assert (report["cell_size_bytes"], report["max_total_num_tokens"]) == (55_224, 777_728)


@pytest.mark.parametrize(("name", "args", "page", "tokens"), [
    ("llama-3.1-8b-instruct", {}, 64, 327_680),  # trtllm_mha: page 1 -> 64
    ("llama-3.1-8b-instruct", {"page_size": 16}, 16, 327_680),  # 16 is trtllm_mha's
    ("gpt-oss-20b", {}, 64, 970_880),
    ("deepseek-v3", {"tp_size": 8}, 64, 611_136),  # trtllm_mla
    ("qwen3-next-80b-a3b-instruct", {"tp_size": 8}, 1, 1_839_937),  # triton: page kept
])
def test_blackwell_pages(name: str, args: dict[str, Any], page: int, tokens: int) -> None:
    report = planned(fixture(name), B200, **args)
    assert (report["page_size"], report["max_total_num_tokens"]) == (page, tokens)


def test_hopper_pages_stay_one() -> None:
    assert planned(fixture("llama-3.1-8b-instruct"), H200)["page_size"] == 1


# --- MiniMax-M2, HiSparse's top-k -----------------------------------------------------------


def test_minimax_m2_every_layer_full_attention() -> None:
    report = planned(minimax_m2(), tp_size=8)
    assert report["max_total_num_tokens"] == 1_353_001
    assert report["cell_size_bytes"] == 31_744  # 62 x 2 x 1 head x 128 x 2 bytes
    assert len(pool(report, "kv")["buffers"]) == 124


def test_hisparse_runs_the_models_index_topk() -> None:
    request = request_from_server_args(
        fixture("deepseek-v3.2-exp"),
        {"tp_size": 8, "context_length": 8192, "kv_cache_dtype": "fp8_e4m3",
         "enable_hisparse": True, "hisparse_config": {"top_k": 1024}},
        {"available_bytes": 40 * GIB})
    plan = plan_sglang(request)
    assert plan.hisparse is not None
    assert plan.hisparse.top_k == 2048  # index_topk, not the config's 1024
    assert plan.hisparse.device_buffer_size == 2048  # 2 x the config's top_k


def test_hisparse_buffer_below_index_topk_is_refused() -> None:
    report = report_for_case(case(fixture("deepseek-v3.2-exp"), tp_size=8,
                                  kv_cache_dtype="fp8_e4m3", enable_hisparse=True,
                                  hisparse_config={"top_k": 512}))
    assert "index_topk" in report["error"]


# --- what SGLang refuses to load ------------------------------------------------------------


def test_an_architecture_sglang_does_not_serve_is_refused() -> None:
    assert "JambaForCausalLM" not in SERVED_ARCHITECTURES
    report = report_for_case(case(fixture("ai21-jamba-mini-1.6")))
    assert "JambaForCausalLM" in report["error"]


def test_a_config_without_model_type_is_refused() -> None:
    config = fixture("llama-3.1-8b-instruct")
    del config["model_type"]
    with pytest.raises(UnsupportedRequestError, match="model_type"):
        read_sglang_config(config)


def test_a_context_longer_than_the_models_is_refused_unless_allowed() -> None:
    llama = fixture("llama-3.1-8b-instruct")
    assert read_sglang_config(llama).context_length == 131_072  # llama3 rope: factor 1
    refused = report_for_case(case(llama, context_length=200_000))
    assert "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN" in refused["error"]
    allowed = report_for_case(case(llama, context_length=200_000,
                                   allow_overwrite_longer_context_len=True))
    assert allowed["req_to_token"]["shape"][1] == 200_004


def test_the_context_length_defaults_to_sglangs_derived_one() -> None:
    gemma = fixture("gemma-3-27b-it")
    report = report_for_case({"config": gemma, "server_args": {"mem_fraction_static": 0.88},
                              "memory": {"available_bytes": 40 * GIB}})
    assert report["req_to_token"]["shape"][1] == 131_072 + 4


# --- the CLI --------------------------------------------------------------------------------


def test_capacity_on_b200_prints_sglangs_fp8_rows(cli: Run) -> None:
    code, out, err = cli("capacity", "deepseek-v3.2", "--engine", "sglang", "--gpu", "b200",
                         "-tp", "8", "--plain")
    assert (code, err) == (0, ""), err
    assert "auto -> fp8_e4m3 (uint8 rows)" in out
    assert "compute capability 10.0" in out
    assert "trtllm/trtllm" in out


# --- DSA layers sharing one index (GLM-5 style) -------------------------------------------


def glm5_shared(freq: int, offset: int | None = None) -> dict[str, Any]:
    config = fixture("glm-5")
    config["index_topk_freq"] = freq
    if offset is not None:
        config["index_skip_topk_offset"] = offset
    return config


@pytest.mark.parametrize(("capability", "args", "cell", "tokens", "rows"), [
    (H200, {"kv_cache_dtype": "fp8_e4m3"}, 53_808, 798_144, 12_472),  # 78 x 656 + 20 x 132
    (B200, {}, 47_568, 902_848, 14_108),  # 78 x 576 + 20 x 132
])
def test_glm5_shared_index_keeps_keys_for_indexer_layers_only(
    capability: list[int], args: dict[str, Any], cell: int, tokens: int, rows: int
) -> None:
    report = planned(glm5_shared(4, 1), capability, tp_size=8, **args)
    assert (report["cell_size_bytes"], report["max_total_num_tokens"]) == (cell, tokens)
    index = pool(report, "index")["buffers"]
    assert len(index) == 78
    real = [b["layer"] for b in index if b["shape"][0]]
    assert real == list(range(0, 78, 4))  # layers 0, 4, ..., 76 run an indexer
    empty = next(b for b in index if b["layer"] == 1)
    assert (empty["shape"], empty["storage_nbytes"], empty["storage"]) == (
        [0, 64 * 132], 0, "index/1")
    assert index[4]["shape"] == [rows, 64 * 132]


def test_glm5_shared_index_default_offset() -> None:
    # freq 3, offset absent (2): SGLang indexes layers 0, 1, 4, 7 of 10.
    config = glm5_shared(3)
    config["num_hidden_layers"] = 10
    report = report_for_case({"config": config, "server_args": {
        "tp_size": 8, "context_length": 8192, "mem_fraction_static": 0.88},
        "memory": {"available_bytes": 4 * GIB}, "gpu": {"capability": H200}})
    assert (report["cell_size_bytes"], report["max_total_num_tokens"]) == (12_048, 356_480)
    index = pool(report, "index")["buffers"]
    assert [b["layer"] for b in index if b["shape"][0]] == [0, 1, 4, 7]


def test_glm5_shared_index_with_hisparse_indexes_every_layer() -> None:
    # SGLang's HiSparseDSATokenToKVPool keeps real index keys for all 78 layers.
    request = request_from_server_args(
        glm5_shared(4, 1), {"tp_size": 8, "context_length": 8192, "mem_fraction_static": 0.88,
                            "kv_cache_dtype": "fp8_e4m3", "enable_hisparse": True},
        {"available_bytes": 40 * GIB})
    report = planned(glm5_shared(4, 1), H200, tp_size=8, kv_cache_dtype="fp8_e4m3",
                     enable_hisparse=True)
    assert report["cell_size_bytes"] == 71_760  # 78 x (656 + 2 x 132)
    assert report["max_total_num_tokens"] == 598_464
    index = pool(report, "index")["buffers"]
    assert [b["shape"] for b in index] == [[18_703, 64 * 132]] * 78
    from hisparse_plan.checking import check_plan

    plan = plan_sglang(request)
    assert plan.index_placeholder_layers == []
    check_plan(plan, request=request)


def test_check_plan_proves_the_placeholders() -> None:
    from hisparse_plan.checking import check_plan
    from hisparse_plan.errors import PlanInvariantError

    request = request_from_server_args(glm5_shared(4, 1), {"tp_size": 8, "context_length": 8192},
                                       {"available_bytes": 40 * GIB})
    plan = plan_sglang(request)
    check_plan(plan, request=request)
    assert len(plan.index_placeholder_layers) == 78 - 20
    short = plan.model_copy(update={"index_placeholder_layers": plan.index_placeholder_layers[1:]})
    with pytest.raises(PlanInvariantError, match="placeholders"):
        check_plan(short)
    index_layer = next(t for t in plan.tensors if t.pool == "index").layers[0]
    stray = plan.model_copy(update={"index_placeholder_layers": [
        index_layer, *plan.index_placeholder_layers[1:]]})
    with pytest.raises(PlanInvariantError, match="latent pool"):
        check_plan(stray)


# --- the multimodal reserve -----------------------------------------------------------------


@pytest.mark.parametrize(("name", "args", "gib", "tokens"), [
    ("gemma-3-27b-it", {}, 40, 84_562),  # Gemma-3: multimodal off unless asked
    ("gemma-3-27b-it", {"enable_multimodal": True}, 40, 84_356),  # 100 MiB less
    ("qwen2.5-vl-7b-instruct", {}, 20, 372_662),  # on by default
    ("llama-3.1-8b-instruct", {"enable_multimodal": True}, 20, 163_840),  # not multimodal
])
def test_the_multimodal_runtime_keeps_100_mib(
    name: str, args: dict[str, Any], gib: int, tokens: int
) -> None:
    report = report_for_case({"config": fixture(name), "server_args": {
        "context_length": 8192, "mem_fraction_static": 0.88, **args},
        "memory": {"available_bytes": gib * GIB}})
    assert report["max_total_num_tokens"] == tokens
    reserve = 100 << 20 if tokens in (84_356, 372_662) else 0
    assert report["available_bytes"] == gib * GIB - reserve
