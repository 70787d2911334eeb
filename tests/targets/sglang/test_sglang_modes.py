"""SGLang's server modes (DP attention, DeepEP's all-to-all, ...) planned as SGLang 0.5.23
sizes them. Every number below is SGLang's own, computed by its code through
references/sglang_reference.py (the case in each test's comment, in that harness's format);
the test plans the same case on our side and compares."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

import hisparse_plan as hp
from hisparse_plan.adapters.sglang import (
    report_for_case,
    request_from_server_args,
    server_args_mapping,
)
from hisparse_plan.models.sglang_plan import SGLangPlan
from hisparse_plan.models.sglang_settings import SGLangSettings
from hisparse_plan.targets.sglang import plan_sglang
from hisparse_plan.targets.sglang.memory_rule import default_mem_fraction_static
from hisparse_plan.targets.sglang.modes.parallel import attn_tp_size, requests_per_worker

DSV32 = "tests/hf_configs/deepseek-v3.2-exp/config.json"
LLAMA = "tests/hf_configs/llama-3.1-8b-instruct/config.json"
H200_BYTES = 150754820096
H200 = {"total_memory_bytes": H200_BYTES, "name": "NVIDIA H200"}
H200_MEMORY = {"pre_model_load_free_bytes": 149250113536,
               "post_weights_free_bytes": 63350767616}
"""DeepSeek-V3.2's weights on one of 8 H200s (references/sglang_cases/dsv32_tp8_h200*)."""
DSV32_TP8 = {"tp_size": 8, "context_length": 8192, "kv_cache_dtype": "fp8_e4m3",
             "dsa_backend": "flashmla_kv"}


def dsv32(**server_args: Any) -> dict[str, Any]:
    return {"config": DSV32, "server_args": {**DSV32_TP8, **server_args},
            "memory": H200_MEMORY, "gpu": H200}


def figures(report: dict[str, Any]) -> tuple[Any, ...]:
    assert "error" not in report, report.get("error")
    return (report["max_total_num_tokens"], report["max_running_requests"],
            report["cell_size_bytes"], report["available_bytes"],
            tuple(report["req_to_token"]["shape"]))


# --- DP attention ------------------------------------------------------------------------


def test_deepseek_v32_tp8_dp_attention_8_on_h200() -> None:
    # {"config": DSV32, "server_args": {"tp_size": 8, "context_length": 8192,
    #  "kv_cache_dtype": "fp8_e4m3", "dsa_backend": "flashmla_kv",
    #  "enable_dp_attention": true, "dp_size": 8}, "memory": H200_MEMORY, "gpu": H200}
    # SGLang: mem_fraction_static 0.758 (34816 MiB kept: 12288 of them DP attention's
    # 512 x 8 x 3 graph padding and 6144 its 512 x 8 x 1.5 above a batch of 300),
    # attention TP 1, chunked prefill 1024.
    report = report_for_case(dsv32(enable_dp_attention=True, dp_size=8))
    assert figures(report) == (566528, 4096, 48068, 27232240140, (4097, 8196))


def test_a_given_max_running_requests_is_shared_by_the_dp_groups() -> None:
    # dsv32(enable_dp_attention=True, dp_size=8, max_running_requests=1000): SGLang runs
    # 1000 // 8 = 125 requests a group; the fraction is unchanged (the decode graph batch,
    # 512, is below the given 1000).
    report = report_for_case(dsv32(enable_dp_attention=True, dp_size=8,
                                   max_running_requests=1000))
    assert figures(report) == (566528, 125, 48068, 27232240140, (126, 8196))


def test_plain_dp_replicas_size_as_one_server() -> None:
    # dsv32(dp_size=2) without --enable-dp-attention: SGLang's fraction 0.886, as TP 8 alone.
    report = report_for_case(dsv32(dp_size=2))
    assert figures(report) == (963968, 4096, 48068, 46336254672, (4097, 8196))


def test_dp_attention_splits_mha_heads_over_tp_over_dp() -> None:
    # {"config": LLAMA, "server_args": {"tp_size": 8, "context_length": 8192,
    #  "mem_fraction_static": 0.9, "enable_dp_attention": true, "dp_size": 4,
    #  "max_running_requests": 10}, "memory": {"pre_model_load_free_bytes": 149250113536,
    #  "post_weights_free_bytes": 147102629888}}
    # SGLang: attention TP 2, so 4 of Llama-3.1-8B's 8 kv heads a rank: 32 layers x 4 x 128 x
    # (K + V) x 2 bytes = 65536 a token; 10 // 4 = 2 requests.
    case = {"config": LLAMA, "memory": {"pre_model_load_free_bytes": 149250113536,
                                        "post_weights_free_bytes": 147102629888},
            "server_args": {"tp_size": 8, "context_length": 8192, "mem_fraction_static": 0.9,
                            "enable_dp_attention": True, "dp_size": 4,
                            "max_running_requests": 10}}
    assert figures(report_for_case(case)) == (2016870, 2, 65536, 132177618534, (3, 8196))


def test_dp_size_must_divide_tp() -> None:
    report = report_for_case(dsv32(enable_dp_attention=True, dp_size=3))
    assert "engine.dp_size" in report["error"]
    assert "divisor of tp_size 8" in report["error"]


def test_the_dp_rules_by_their_own_arithmetic() -> None:
    settings = SGLangSettings(name="sglang", context_length=8, tp_size=8,
                              enable_dp_attention=True, dp_size=4)
    assert attn_tp_size(settings) == 2
    assert requests_per_worker(settings, 3) == 1  # never none
    assert requests_per_worker(settings, 10) == 2
    replicas = settings.model_copy(update={"enable_dp_attention": False})
    assert attn_tp_size(replicas) == 8
    assert requests_per_worker(replicas, 10) == 10


def test_a_resolved_server_args_keeps_dp_attention_as_attn_dp_size() -> None:
    # SGLang's resolution turns --dp-size 8 --enable-dp-attention into attn_dp_size 8,
    # dp_size 1, enable_dp_attention False.
    resolved = SimpleNamespace(tp_size=8, context_length=8192, attn_dp_size=8, dp_size=1,
                               enable_dp_attention=False, moe_a2a_backend="mooncake")
    mapping = server_args_mapping(resolved)
    assert (mapping["enable_dp_attention"], mapping["dp_size"]) == (True, 8)
    assert mapping["moe_a2a_backend"] == "none"


# --- DeepEP ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "fraction", "expected"),
    [
        # dsv32(moe_a2a_backend="deepep"): 16384 MiB kept as without DeepEP, then 1024 for
        # prefill graphs (breakable, SGLang's CUDA default) and 2048 on top of the floor.
        ({}, 0.865, (898752, 4096, 48068, 43202002288, (4097, 8196))),
        # dsv32(moe_a2a_backend="deepep", enable_dp_attention=True, dp_size=8)
        ({"enable_dp_attention": True, "dp_size": 8}, 0.736,
         (498176, 4096, 48068, 23948737642, (4097, 8196))),
    ],
)
def test_deepep_moves_only_the_default_fraction(
    args: dict[str, Any], fraction: float, expected: tuple[Any, ...]
) -> None:
    report = report_for_case(dsv32(moe_a2a_backend="deepep", **args))
    assert figures(report) == expected
    settings = SGLangSettings(name="sglang", context_length=8192, tp_size=8,
                              gpu_memory_bytes=H200_BYTES,
                              moe_a2a_backend="deepep", **args)
    assert default_mem_fraction_static(settings, mla=True) == fraction


@pytest.mark.parametrize(("args", "fraction", "tokens", "available"), [
    # {"config": LLAMA, "server_args": {"tp_size": 1, "context_length": 8192, **args},
    #  "memory": {"pre_model_load_free_bytes": 190118363136,
    #             "post_weights_free_bytes": 145021206528},
    #  "gpu": {"total_memory_bytes": 192265846784, "name": "NVIDIA B200"}}
    # Without DeepEP: 74 prefill graph sizes up to the 16384-token chunk (592 MiB).
    ({}, 0.854, 894652, 117263925510),
    # DeepEP fixes them first: the 2048-token default's sizes rounded up to multiples of 8,
    # 38 of them (304 MiB), then 1 GiB + 2 GiB more.
    ({"moe_a2a_backend": "deepep"}, 0.838, 871444, 114222031699),
])
def test_deepep_fixes_the_prefill_graphs_of_a_non_mla_model(
    args: dict[str, Any], fraction: float, tokens: int, available: int
) -> None:
    b200_bytes = 192265846784
    b200 = {"total_memory_bytes": b200_bytes, "name": "NVIDIA B200"}
    report = report_for_case({"config": LLAMA, "gpu": b200, "memory": {
        "pre_model_load_free_bytes": 190118363136, "post_weights_free_bytes": 145021206528},
        "server_args": {"tp_size": 1, "context_length": 8192, **args}})
    assert figures(report) == (tokens, 4096, 131072, available, (4097, 8196))
    settings = SGLangSettings(name="sglang", context_length=8192, tp_size=1,
                              gpu_memory_bytes=b200_bytes, **args)
    assert default_mem_fraction_static(settings, mla=False) == fraction


def test_deepep_reserve_follows_the_graph_switches() -> None:
    # (143771 - r) / 143771 rounded: without DeepEP r = 16384 (MLA, H200, TP 8); DeepEP adds
    # 2048 with decode graphs and 1024 with prefill graphs; with neither graph, no DeepEP and
    # no graph reserve (the 10 GiB floor then holds: 13824 MiB).
    def fraction(**switches: Any) -> float:
        return default_mem_fraction_static(SGLangSettings(
            name="sglang", context_length=8192, tp_size=8, moe_a2a_backend="deepep",
            gpu_memory_bytes=H200_BYTES, **switches), mla=True)

    assert fraction(disable_prefill_cuda_graph=True) == round((143771 - 14848 - 2048) / 143771, 3)
    assert fraction(disable_decode_cuda_graph=True) == round((143771 - 15360 - 1024) / 143771, 3)
    assert fraction(disable_decode_cuda_graph=True, disable_prefill_cuda_graph=True) == round(
        (143771 - 13824) / 143771, 3)


# --- radix cache off ---------------------------------------------------------------------

GPT_OSS_20B = "tests/hf_configs/gpt-oss-20b/config.json"
QWEN3_NEXT = "tests/hf_configs/qwen3-next-80b-a3b-instruct/config.json"
GPT_OSS_MEMORY = {"pre_model_load_free_bytes": 149250113536,
                  "post_weights_free_bytes": 149250113536 - 14 * 2**30}


def _pool_tokens(report: dict[str, Any]) -> dict[str, int]:
    return {pool["name"]: pool["tokens"] for pool in report["pools"]}


@pytest.mark.parametrize(("radix_off", "kv", "swa"), [
    # The window pool sized for 64 requests: (128 window + 128 eviction interval + 2 pages)
    # x 64 + 2 chunks of 8192 (the H200 default) + a page = 32897; the full pool the rest.
    (True, 4857574, 32897),
    # The radix cache on: the window pool int(0.8 x the full pool's tokens).
    (False, 2716928, 2173542),
])
def test_gpt_oss_20b_with_the_radix_cache_off(radix_off: bool, kv: int, swa: int) -> None:
    # {"config": GPT_OSS_20B, "server_args": {"tp_size": 1, "context_length": 8192,
    #  "max_running_requests": 64, "disable_radix_cache": radix_off},
    #  "memory": GPT_OSS_MEMORY, "gpu": H200}: SGLang's fraction 0.906,
    # SWARequestCapPoolConfigurator with the cache off, HybridSWAPoolConfigurator with it on.
    report = report_for_case({"config": GPT_OSS_20B, "memory": GPT_OSS_MEMORY, "gpu": H200,
                              "server_args": {"tp_size": 1, "context_length": 8192,
                                              "max_running_requests": 64,
                                              "disable_radix_cache": radix_off}})
    assert figures(report) == (kv, 64, 44236.8, 120188217327, (65, 8196))
    assert _pool_tokens(report) == {"kv": kv, "swa": swa}


def test_the_request_cap_without_a_gpu_uses_sglangs_4096_chunk() -> None:
    # GPT_OSS_20B, mem_fraction_static 0.9, no "gpu": SGLang's chunk falls back to 4096, so
    # 258 x 64 + 2 x 4096 + 1 = 24705 window tokens.
    report = report_for_case({"config": GPT_OSS_20B, "memory": GPT_OSS_MEMORY,
                              "server_args": {"tp_size": 1, "context_length": 8192,
                                              "mem_fraction_static": 0.9,
                                              "max_running_requests": 64,
                                              "disable_radix_cache": True}})
    assert _pool_tokens(report) == {"kv": 4829328, "swa": 24705}


@pytest.mark.parametrize(("args", "expected"), [
    # One Mamba slot a request: 64 slots for 64 requests.
    ({"max_running_requests": 64}, (1696536, 64, 12288, 20847042560, (65, 8196))),
    # No requests given: the slots from the memory ratio (1052), each one request.
    ({}, (919968, 1052, 12288, 11304574976, (1053, 8196))),
    # DP attention 4: 64 // 4 = 16 slots and requests a group; heads over TP 2.
    ({"max_running_requests": 64, "enable_dp_attention": True, "dp_size": 4},
     (1694178, 16, 12288, 20818067456, (17, 8196))),
])
def test_qwen3_next_with_the_radix_cache_off(
    args: dict[str, Any], expected: tuple[Any, ...]
) -> None:
    # {"config": QWEN3_NEXT, "server_args": {"tp_size": 8, "context_length": 8192,
    #  "mem_fraction_static": 0.88, "disable_radix_cache": true, **args},
    #  "memory": {"available_bytes": 20 GiB}}
    report = report_for_case({"config": QWEN3_NEXT, "memory": {"available_bytes": 20 * 2**30},
                              "server_args": {"tp_size": 8, "context_length": 8192,
                                              "mem_fraction_static": 0.88,
                                              "disable_radix_cache": True, **args}})
    assert figures(report) == expected
    assert _pool_tokens(report)["mamba_temporal"] == expected[1]


def _checked(report_case: dict[str, Any], edit: Any = None) -> None:
    request = request_from_server_args(report_case["config"], report_case["server_args"],
                                       report_case["memory"], gpu=report_case.get("gpu"))
    data = plan_sglang(request).model_dump(mode="json")
    if edit is not None:
        edit(data)
    hp.check_plan(SGLangPlan.model_validate(data))


def test_check_plan_proves_a_request_capped_window_pool() -> None:
    case = {"config": GPT_OSS_20B, "memory": GPT_OSS_MEMORY, "gpu": H200,
            "server_args": {"tp_size": 1, "context_length": 8192, "max_running_requests": 64,
                            "disable_radix_cache": True}}
    _checked(case)  # 4857574 x 44236.8 exceeds the budget: the pools' own bytes do not
    # 12 full and 12 window layers of 8 heads x 64 x (K + V) x 2 bytes: 24576 bytes a token
    # each; the pools take 4857574 + 32897 tokens of it.
    used = (4857574 + 32897) * 24576

    def shrink(plan: dict[str, Any]) -> None:
        plan["budget"]["available_bytes"] = used - 1

    with pytest.raises(hp.PlanInvariantError, match="window pool's 32897 pages"):
        _checked(case, shrink)

    def ratio_rule(plan: dict[str, Any]) -> None:
        plan["budget"]["swa_sized_for_requests"] = False

    # Read as a ratio-sized window pool, the window pool is not the ratio the cell gives (and
    # the full pool's cells overrun the budget): refused by whichever check runs first.
    with pytest.raises(hp.PlanInvariantError,
                       match=r"counts the window pool at|exceeds budget\.available_bytes"):
        _checked(case, ratio_rule)

    def requests_rule(plan: dict[str, Any]) -> None:
        plan["budget"]["swa_sized_for_requests"] = True

    with pytest.raises(hp.PlanInvariantError, match="without a window pool"):
        _checked({"config": QWEN3_NEXT, "memory": {"available_bytes": 20 * 2**30},
                  "server_args": {"tp_size": 8, "context_length": 8192,
                                  "mem_fraction_static": 0.88}}, requests_rule)


def test_check_plan_reads_the_mamba_slots_a_request() -> None:
    case = {"config": QWEN3_NEXT, "memory": {"available_bytes": 20 * 2**30},
            "server_args": {"tp_size": 8, "context_length": 8192, "mem_fraction_static": 0.88,
                            "disable_radix_cache": True, "max_running_requests": 64}}
    _checked(case)

    def five(plan: dict[str, Any]) -> None:
        plan["budget"]["mamba_slots_per_request"] = 5

    with pytest.raises(hp.PlanInvariantError, match="needs 320 Mamba state slots"):
        _checked(case, five)

    def stray(plan: dict[str, Any]) -> None:
        plan["budget"]["mamba_slots_per_request"] = 1

    with pytest.raises(hp.PlanInvariantError, match="expected null without Mamba"):
        _checked({"config": GPT_OSS_20B, "memory": GPT_OSS_MEMORY, "gpu": H200,
                  "server_args": {"tp_size": 1, "context_length": 8192}}, stray)


# --- decode context parallelism (DSA) ----------------------------------------------------


@pytest.mark.parametrize(("dcp", "tokens", "cell", "index_rows"), [
    # {"config": DSV32, "server_args": {"tp_size": 8, "context_length": 8192,
    #  "mem_fraction_static": 0.9, "kv_cache_dtype": "fp8_e4m3", "dsa_backend": "flashmla_kv",
    #  "dcp_size": dcp}, "memory": H200_MEMORY} (references/sglang_cases/dsv32_tp8_h200.json
    # with dcp_size). 61 layers: 656-byte latent rows + 132 index bytes x dcp a token; the
    # index pool holds (tokens + 64) x dcp - 64 rows.
    (1, 1007424, 48068, 1007424),
    (2, 862848, 56120, 1725760),
    (8, 463680, 104432, 3709888),
])
def test_deepseek_v32_decode_context_parallelism(
    dcp: int, tokens: int, cell: int, index_rows: int
) -> None:
    report = report_for_case({"config": DSV32, "memory": H200_MEMORY, "server_args": {
        **DSV32_TP8, "mem_fraction_static": 0.9, "dcp_size": dcp}})
    assert figures(report) == (tokens, 4096, cell, 48425756262, (4097, 8196))
    assert _pool_tokens(report) == {"kv": tokens, "index": index_rows}
    assert cell == 61 * (656 + 132 * dcp)
    assert index_rows == (tokens + 64) * dcp - 64
    request = request_from_server_args(DSV32, {**DSV32_TP8, "mem_fraction_static": 0.9,
                                               "dcp_size": dcp}, H200_MEMORY)
    plan = plan_sglang(request)
    hp.check_plan(plan)
    # A request's context in stored rows of every rank: 8192 tokens a request of dcp x tokens.
    assert plan.capacity.max_concurrency == min(4096, tokens * dcp / 8192)


@pytest.mark.parametrize(("config", "args", "words"), [
    (LLAMA, {"tp_size": 8, "dcp_size": 2, "mem_fraction_static": 0.9},
     "planned for DSA models"),
    (DSV32, {**DSV32_TP8, "dcp_size": 2, "mem_fraction_static": 0.9, "enable_hisparse": True},
     "refuses HiSparse with decode context parallelism"),
])
def test_decode_context_parallelism_refused_beyond_dsa(
    config: str, args: dict[str, Any], words: str
) -> None:
    report = report_for_case({"config": config, "memory": H200_MEMORY, "server_args": args})
    assert words in report["error"]


def test_decode_context_parallelism_turns_sglangs_prefill_graphs_off() -> None:
    # dsv32(dcp_size=8) (the H200 default-fraction case with dcp_size 8): SGLang captures no
    # prefill graph under DCP, so the MLA prefill graphs' 1536 MiB are not kept back:
    # (143771 - 512 - 8192 x 1.5 - 1024 - 512 x 2) / 143771 = 0.897 (0.886 without DCP).
    report = report_for_case(dsv32(dcp_size=8))
    assert figures(report) == (459392, 4096, 104432, 47978005921, (4097, 8196))
    assert round((143771 - 512 - 8192 * 1.5 - 1024 - 512 * 2) / 143771, 3) == 0.897
    settings = SGLangSettings(name="sglang", context_length=8192, tp_size=8, dcp_size=8,
                              gpu_memory_bytes=H200_BYTES)
    assert default_mem_fraction_static(settings, mla=True) == 0.897
