"""SGLang 0.5.23's default mem_fraction_static (targets/sglang/memory_rule.py) against the
fractions SGLang itself resolved (references/sglang_reference.py with the case's GPU memory:
ServerArgs' own rule ran), each rule on its own, and the plan's budget when the fraction is left
to SGLang. SGLang is not imported."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hisparse_plan.errors import PlanError, UnsupportedRequestError
from hisparse_plan.models.request import PlanRequest
from hisparse_plan.models.sglang_settings import SGLangSettings
from hisparse_plan.presets.hardware import GPUS, find_gpu
from hisparse_plan.targets.sglang import plan_sglang
from hisparse_plan.targets.sglang.memory_rule import (
    decode_graph_max_bs,
    default_chunked_prefill_size,
    default_mem_fraction_static,
    gpu_memory_mib,
    graph_reserve_mib,
    prefill_graph_max_tokens,
    prefill_graph_sizes,
    reserved_mib,
)

MIB = 1 << 20
H100 = find_gpu("h100").hbm_bytes
H200 = find_gpu("h200").hbm_bytes
B200 = find_gpu("b200").hbm_bytes
A100 = find_gpu("a100-80gb").hbm_bytes
MI300X = find_gpu("mi300x").hbm_bytes
PRE = 149_250_113_536
"""Free bytes before the weights load on an H200 (139 GiB), as in the reference cases."""


def settings(gpu: int | None, **extra: Any) -> SGLangSettings:
    extra.setdefault("context_length", 8192)
    return SGLangSettings(name="sglang", gpu_memory_bytes=gpu, **extra)


# --- SGLang's own runs: references/sglang_cases/*_default_fraction.json and single points of
# references/sglang_fraction_sweep.py (1800 points agree) --------------------------------------

@pytest.mark.parametrize(
    ("gpu", "tp", "mla", "extra", "fraction"),
    [
        (H200, 8, True, {}, 0.886),     # dsv32_tp8_h200_default_fraction
        (H200, 8, False, {}, 0.893),    # gptoss120b_tp8_h200_default_fraction
        (H100, 1, False, {}, 0.83),     # llama31_8b_tp1_h100_default_fraction
        (B200, 8, True, {}, 0.844),
        (B200, 1, False, {}, 0.854),
        (A100, 4, False, {"max_running_requests": 64}, 0.83),
        (H200, 8, True, {"chunked_prefill_size": 4096}, 0.929),
        (H100, 2, False, {"max_total_tokens": 3000}, 0.829),
        (H200, 8, False, {"disable_prefill_cuda_graph": True}, 0.897),
        (15360 * MIB, 1, False, {}, 0.735),                          # 16 GB (T4)
        (23028 * MIB, 4, False, {}, 0.657),                          # A10, Qwen3-Next
        (46068 * MIB, 2, True, {"disable_decode_cuda_graph": True}, 0.817),  # L40S, DeepSeek-V3
        (H100, 1, False, {"chunked_prefill_size": 2048}, 0.874),     # the 10 GiB floor
        (MI300X, 8, True, {"chunked_prefill_size": 32768}, 0.729),
    ],
)
def test_fraction_is_sglangs(
    gpu: int, tp: int, mla: bool, extra: dict[str, Any], fraction: float
) -> None:
    assert default_mem_fraction_static(settings(gpu, tp_size=tp, **extra), mla=mla) == fraction


# --- the rules one by one -------------------------------------------------------------------

def test_gpu_memory_is_read_in_whole_mib() -> None:
    assert gpu_memory_mib(H200) == 143_771.0
    assert gpu_memory_mib(H200 + MIB - 1) == 143_771.0


@pytest.mark.parametrize(
    ("mib", "chunk", "bs_tp1", "bs_tp4"),
    [
        (15_360, 2048, 8, 8), (20 * 1024 - 1, 2048, 8, 8), (20 * 1024, 4096, 48, 160),
        (35 * 1024, 4096, 32, 160), (60 * 1024, 8192, 256, 512), (81_559, 8192, 256, 512),
        (143_771, 8192, 256, 512), (160 * 1024, 16384, 512, 512), (183_359, 16384, 512, 512),
    ],
)
def test_gpu_tiers(mib: float, chunk: int, bs_tp1: int, bs_tp4: int) -> None:
    assert default_chunked_prefill_size(mib) == chunk
    assert decode_graph_max_bs(mib, 1, None) == bs_tp1
    assert decode_graph_max_bs(mib, 4, None) == bs_tp4


def test_decode_graph_batch_is_lowered_to_max_running_requests() -> None:
    assert decode_graph_max_bs(143_771, 8, 100) == 100
    assert decode_graph_max_bs(143_771, 8, 4096) == 512


def test_prefill_graph_sizes() -> None:
    assert [prefill_graph_sizes(n) for n in (1, 4, 32, 2048, 3000, 4096, 8192, 16384)] == [
        0, 1, 8, 42, 45, 50, 58, 74]
    # Counted, never listed: a chunk size near int64 (found by test_extremes running out of
    # 24 GiB) is 50 counts up to 4096, then one every 512 tokens from 4608.
    assert prefill_graph_sizes(2**62) == 50 + (2**62 - 4608) // 512 + 1


def test_prefill_graph_tokens_mla_cap_and_max_total_tokens() -> None:
    assert prefill_graph_max_tokens(16384, False, None) == 16384
    assert prefill_graph_max_tokens(16384, True, None) == 8192
    assert prefill_graph_max_tokens(8192, False, 3000) == 3000


def test_graph_reserve() -> None:
    assert graph_reserve_mib(512, 58, False, decode_graphs=True, prefill_graphs=True) == 1488.0
    assert graph_reserve_mib(512, 58, True, decode_graphs=True, prefill_graphs=True) == 2560.0
    assert graph_reserve_mib(512, 58, True, decode_graphs=False, prefill_graphs=False) == 0.0


def test_reserve_floor_only_above_60_gib() -> None:
    assert reserved_mib(81_559, 2048, 1, 1, 848.0) == 10 * 1024
    assert reserved_mib(46_068, 2048, 1, 1, 848.0) == 512 + 3072 + 128 + 848


def test_worked_example_h200_tp8_mla() -> None:
    # 512 + 8192 * 1.5 + 8 / 8 * 1024 + 512 * 2 + 1536 = 16384 MiB of 143771
    reserve = reserved_mib(143_771, 8192, 8, 1, graph_reserve_mib(
        512, 58, True, decode_graphs=True, prefill_graphs=True))
    assert reserve == 16_384.0
    assert round((143_771 - reserve) / 143_771, 3) == 0.886


@given(
    gpu=st.sampled_from([gpu.hbm_bytes for gpu in GPUS]),
    tp=st.sampled_from([1, 2, 4, 8]),
    mla=st.booleans(),
    chunk=st.none() | st.integers(1, 32768),
    requests=st.none() | st.integers(1, 8192),
)
def test_fraction_is_a_rounded_share_of_the_gpu(
    gpu: int, tp: int, mla: bool, chunk: int | None, requests: int | None
) -> None:
    fraction = default_mem_fraction_static(
        settings(gpu, tp_size=tp, chunked_prefill_size=chunk, max_running_requests=requests),
        mla=mla,
    )
    assert 0 < fraction < 1
    assert round(fraction, 3) == fraction
    # at least 10 GiB (these GPUs are all above 60 GiB) stays out of the static share
    assert fraction <= round(1 - 10 * 1024 / gpu_memory_mib(gpu), 3)


def test_refuses_a_gpu_smaller_than_the_reserve() -> None:
    # 16 GB tier: 512 + 2048 * 1.5 + 128 + 8 * 2 + 42 * 8 = 4064 MiB kept back
    assert default_mem_fraction_static(settings(4096 * MIB), mla=False) == 0.008
    with pytest.raises(PlanError, match="expected a GPU of more than that") as info:
        default_mem_fraction_static(settings(2048 * MIB), mla=False)
    assert info.value.field == "engine.gpu_memory_bytes"
    with pytest.raises(PlanError, match=r"rounds to 0\.0 "):
        default_mem_fraction_static(settings(4066 * MIB), mla=False)
    with pytest.raises(PlanError, match="expected a byte count, got null"):
        default_mem_fraction_static(settings(None), mla=False)


# --- the plan: a null fraction takes SGLang's rule when gpu_memory_bytes is given ------------

def _request(layers: dict[str, Any], **engine: Any) -> PlanRequest:
    engine.setdefault("context_length", 8192)
    return PlanRequest.model_validate({
        "layers": layers,
        "model": {"max_model_len": engine["context_length"]},
        "device": {"available_bytes": 0},
        "engine": {"name": "sglang", **engine},
    })


def _dsa_layers(n: int) -> dict[str, Any]:
    row = {"kind": "mla", "block_size": 64, "head_size": 576, "dtype": "uint8",
           "cache_dtype": "fp8_ds_mla", "state_content_bytes": 656}
    index = {"kind": "mla", "block_size": 64, "head_size": 132, "dtype": "uint8",
             "cache_role": "indexer"}
    layers: dict[str, Any] = {}
    for i in range(n):
        layers[f"l{i}.attn"], layers[f"l{i}.indexer"] = row, index
    return layers


def _attention(kind: str, heads: int, head: int, **extra: Any) -> dict[str, Any]:
    return {"kind": kind, "block_size": 16, "num_kv_heads": heads, "head_size": head,
            "dtype": "bfloat16", **extra}


def _gpt_oss_tp8() -> dict[str, Any]:
    return {f"l{i}": _attention("sliding_window", 1, 64, sliding_window=128) if i % 2 == 0
            else _attention("full_attention", 1, 64) for i in range(36)}


@pytest.mark.parametrize(
    ("layers", "engine", "fraction", "available", "tokens"),
    [
        (_dsa_layers(61), {"tp_size": 8, "gpu_memory_bytes": H200, "kv_cache_dtype": "fp8_e4m3",
                           "pre_model_load_free_bytes": PRE,
                           "post_weights_free_bytes": 63_350_767_616},
         0.886, 46_336_254_672, 963_968),
        (_gpt_oss_tp8(), {"tp_size": 8, "gpu_memory_bytes": H200,
                          "pre_model_load_free_bytes": PRE,
                          "post_weights_free_bytes": 140_660_178_944},
         0.893, 124_690_416_795, 15_033_084),
        ({f"l{i}": _attention("full_attention", 8, 128) for i in range(32)},
         {"tp_size": 1, "gpu_memory_bytes": H100, "pre_model_load_free_bytes": 84_825_604_096,
          "post_weights_free_bytes": 68_765_081_600},
         0.83, 54_344_728_903, 414_617),
    ],
    ids=["dsv32_tp8_h200", "gptoss120b_tp8_h200", "llama31_8b_tp1_h100"],
)
def test_plan_budget_with_sglangs_default_fraction(
    layers: dict[str, Any], engine: dict[str, Any], fraction: float, available: int, tokens: int
) -> None:
    plan = plan_sglang(_request(layers, **engine))
    assert plan.budget.mem_fraction_static == fraction
    assert plan.budget.available_bytes == available
    assert plan.max_total_num_tokens == tokens
    assert plan.max_running_requests == 4096


def test_given_fraction_wins_over_the_rule() -> None:
    plan = plan_sglang(_request(_dsa_layers(61), tp_size=8, gpu_memory_bytes=H200,
                                mem_fraction_static=0.9, kv_cache_dtype="fp8_e4m3",
                                pre_model_load_free_bytes=PRE,
                                post_weights_free_bytes=63_350_767_616))
    assert plan.budget.mem_fraction_static == 0.9
    assert plan.budget.available_bytes == 48_425_756_262


def test_null_fraction_without_gpu_memory_is_still_refused() -> None:
    with pytest.raises(UnsupportedRequestError, match="gpu_memory_bytes") as info:
        plan_sglang(_request(_dsa_layers(2), pre_model_load_free_bytes=PRE,
                             post_weights_free_bytes=PRE // 2))
    assert info.value.field == "engine.mem_fraction_static"


def test_budget_given_keeps_no_fraction() -> None:
    data = _request({"a": _attention("full_attention", 8, 128)}, gpu_memory_bytes=H200)
    data = data.model_copy(update={"device": data.device.model_copy(
        update={"available_bytes": 1 << 30})})
    plan = plan_sglang(data)
    assert plan.budget.mem_fraction_static is None
    assert plan.budget.available_bytes == 1 << 30
