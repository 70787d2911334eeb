"""Real hardware: GPUs by name, one rank's HBM split to the byte, and MTP draft layers."""

from __future__ import annotations

import json
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

import hisparse_plan as hp
from hisparse_plan.presets import ConfigError, Settings, Weights, build_request, load_preset
from hisparse_plan.presets.hardware import (
    GPUS,
    find_gpu,
    memory_breakdown,
    utilization,
    weight_bytes,
)
from support.cli_support import Run

GIB = 2**30
DEEPSEEK_WEIGHTS = load_preset("deepseek-v3.2").weights


def test_gpus_by_name_and_alias() -> None:
    assert find_gpu("H200").hbm_bytes == 143771 * 2**20
    assert find_gpu("h100-sxm").hbm_bytes == 81559 * 2**20
    assert find_gpu("MI300X").hbm_bytes == 205822885888
    assert all(gpu.source for gpu in GPUS)
    with pytest.raises(ConfigError, match="unknown GPU 'tpu'; expected one of a100-80gb"):
        find_gpu("tpu")


def test_weights_are_parameters_times_bits() -> None:
    assert weight_bytes(Weights(8_000_000_000, "16", "")) == 16_000_000_000
    assert weight_bytes(Weights(3, "4.25", "")) == 2  # 12.75 bits, rounded up to bytes


@given(
    gpu=st.sampled_from(GPUS),
    tp=st.sampled_from([1, 2, 4, 8]),
    pp=st.integers(1, 4),
    percent=st.integers(50, 100),
)
def test_breakdown_adds_up_to_the_hbm(gpu: hp.presets.hardware.GPU, tp: int, pp: int,
                                      percent: int) -> None:
    assert DEEPSEEK_WEIGHTS is not None
    share = f"{percent / 100}"
    budget = -(-gpu.hbm_bytes * percent // 100)
    if budget <= -(-weight_bytes(DEEPSEEK_WEIGHTS) // (tp * pp)) + 4 * GIB:
        with pytest.raises(ConfigError, match="leaves no KV cache"):
            memory_breakdown(gpu, DEEPSEEK_WEIGHTS, tp=tp, pp=pp, gpu_memory_utilization=share)
        return
    split = memory_breakdown(gpu, DEEPSEEK_WEIGHTS, tp=tp, pp=pp, gpu_memory_utilization=share)
    assert sum(nbytes for _, nbytes in split.parts) == gpu.hbm_bytes
    assert split.kv_cache > 0
    assert split.weights * tp * pp >= weight_bytes(DEEPSEEK_WEIGHTS)


def test_h200_tp8_deepseek_by_hand() -> None:
    assert DEEPSEEK_WEIGHTS is not None
    split = memory_breakdown(find_gpu("h200"), DEEPSEEK_WEIGHTS, tp=8,
                             gpu_memory_utilization="0.9")
    hbm = 143771 * 2**20
    budget = -(-hbm * 9 // 10)  # vLLM: ceil(total * utilization)
    assert split.held_back == hbm - budget
    assert split.weights == 685_000_000_000 // 8
    assert split.kv_cache == budget - 685_000_000_000 // 8 - 4 * GIB


@pytest.mark.parametrize("text", ["0", "1.5", "-0.1", "abc", "1/0"])
def test_utilization_out_of_range(text: str) -> None:
    with pytest.raises(ConfigError, match="gpu_memory_utilization"):
        utilization(text)


def test_a_gpu_too_small_for_the_weights_is_refused() -> None:
    assert DEEPSEEK_WEIGHTS is not None
    with pytest.raises(ConfigError, match="leaves no KV cache"):
        memory_breakdown(find_gpu("h100"), DEEPSEEK_WEIGHTS, tp=1)


def test_plan_on_real_hardware_says_where_each_byte_went(cli: Run) -> None:
    code, out, err = cli("plan", "deepseek-v3.2", "--gpu", "h200", "--tp", "8",
                         "--gpu-memory-utilization", "0.9", "--plain")
    assert code == 0, err
    rows = {}
    for line in out[out.index("one rank's HBM"):].splitlines()[2:]:
        words = line.split()
        if len(words) >= 3 and words[-3].isdigit():
            rows[" ".join(words[:-3])] = int(words[-3])
        elif len(words) >= 2 and words[-2].isdigit():
            rows[" ".join(words[:-2])] = int(words[-2])
    total = rows.pop("HBM of one NVIDIA H200 141GB HBM3e")
    assert total == 143771 * 2**20
    assert sum(rows.values()) == total
    code, json_out, _ = cli("plan", "deepseek-v3.2", "--gpu", "h200", "--tp", "8", "--json")
    body = json.loads(json_out)
    plan = hp.KVCachePlan.model_validate(body["plan"])
    json_rows = {row["part"]: row["bytes"] for row in body["memory"]["per_rank"]}
    assert sum(json_rows.values()) == total
    assert json_rows["weights"] == rows["weights (1/8 of the model)"]
    assert DEEPSEEK_WEIGHTS is not None
    split = memory_breakdown(find_gpu("h200"), DEEPSEEK_WEIGHTS, tp=8)
    assert plan.device_pool.available_bytes == split.kv_cache
    assert plan.host_pool is not None
    assert plan.host_pool.shared


def test_explicit_kv_memory_overrides_the_estimate(cli: Run) -> None:
    code, out, err = cli("plan", "llama-3-8b", "--gpu", "h100", "--kv-cache-memory", "20GiB",
                         "--json")
    assert code == 0, err
    body = json.loads(out)
    assert hp.KVCachePlan.model_validate(body["plan"]).device_pool.available_bytes == 20 * GIB
    assert body["memory"]["per_rank"][0]["part"] == "not_for_kv_cache"
    code, _, err = cli("plan", "llama-3-8b", "--gpu-mem", "20GiB", "--kv-cache-memory", "20GiB")
    assert code == 2
    assert "expected one of them" in err
    code, _, err = cli("plan", "llama-3-8b", "--gpu-memory-utilization", "0.8")
    assert code == 2
    assert "needs --gpu NAME" in err


def test_utilization_is_exact() -> None:
    assert utilization("0.9") == Fraction(9, 10)


# -- MTP draft layers -----------------------------------------------------------------------


def test_mtp_layers_join_as_vllm_names_them() -> None:
    arch = load_preset("deepseek-v3.2").architecture
    request = build_request(arch, Settings(speculative="mtp", spec_tokens=3))
    names = list(request.layers)
    # DeepSeek-V3.2 has one MTP layer: decoder layer 61 of the draft model.
    assert names[-2:] == ["model.layers.61.self_attn.attn",
                          "model.layers.61.self_attn.indexer.k_cache"]
    assert len(names) == 2 * 62
    assert request.hisparse is not None
    assert request.hisparse.max_decode_query_len == 4
    # One MTP module reused for 3 tokens: vLLM's prefill lookahead is 1.
    assert request.scheduler.num_prefill_lookahead_tokens == 1
    default_k = build_request(arch, Settings(speculative="mtp"))
    assert default_k.hisparse is not None
    assert default_k.hisparse.max_decode_query_len == 2
    hp.plan(request)


def test_mtp_without_draft_layers_or_with_stages_is_refused() -> None:
    with pytest.raises(ConfigError, match="num_nextn_predict_layers is 0"):
        build_request(load_preset("deepseek-v3.2").architecture.model_copy(
            update={"num_nextn_predict_layers": 0}), Settings(speculative="mtp"))
    with pytest.raises(ConfigError, match="expected --pp 1"):
        build_request(load_preset("deepseek-v3.2").architecture,
                      Settings(speculative="mtp", pp=2, hisparse=False))


def test_mtp_layer_runs_its_own_indexer_even_when_sharing_would_skip_it() -> None:
    # GLM-5 with index sharing every 4th layer: layer 78 would share (78 % 4 != 0), but vLLM
    # builds an indexer for every MTP layer.
    request = build_request(load_preset("glm-5-index-share-4").architecture,
                            Settings(speculative="mtp", max_model_len=32768))
    assert "model.layers.78.self_attn.indexer.k_cache" in request.layers
    mtp = request.layers["model.layers.78.self_attn.attn"]
    assert mtp.is_index_group_leader  # type: ignore[union-attr]
