"""Named pairs of plans a disaggregated deployment meets (issue 29): each moves a request's KV
through a proved program, and reading the destination back through its own views finds every
(layer, token, head, byte) where it belongs and nothing else written."""

from __future__ import annotations

from typing import Any

import pytest

import hisparse_plan as hp
from hisparse_plan.exchange.transfer import (
    Instance,
    TransferRefused,
    TransferRequest,
    build_transfer,
)
from hisparse_plan.models import KVCacheLayout
from hisparse_plan.presets import Settings, build_request, load_preset
from support.transfer_support import (
    attention_layers,
    deepseek_plan,
    request_blocks,
    roundtrip,
    vllm_plan,
)

TOKENS = 300


def trimmed(preset: str, decoder_layers: int, **settings: Any) -> hp.KVCachePlan:
    """A preset's first decoder layers, planned for one rank of `settings.tp`."""
    request = build_request(load_preset(preset).architecture, Settings(**settings))
    data = request.model_dump(mode="json")
    keep = tuple(f"model.layers.{i}." for i in range(decoder_layers))
    data["layers"] = {name: spec for name, spec in data["layers"].items()
                      if name.startswith(keep)}
    return hp.plan(hp.PlanRequest.model_validate(data))


def moved(src: Instance, dst: Instance, tokens: int = TOKENS, seed: int = 0,
          runs: bool = False) -> Any:
    request = TransferRequest(
        num_tokens=tokens, source_blocks=request_blocks(src, tokens, seed, runs=runs),
        destination_blocks=request_blocks(dst, tokens, seed + 1, runs=runs))
    program, wrong = roundtrip(src, dst, request)
    assert wrong == 0
    return program


@pytest.mark.parametrize("runs", [False, True])
def test_deepseek_v32_vllm_prefill_to_a_vllm_hisparse_decode(runs: bool) -> None:
    prefill = Instance([deepseek_plan(hisparse=False, layers=3)])
    decode = Instance([deepseek_plan(hisparse=True, layers=3)])
    program = moved(prefill, decode, runs=runs)
    # Latent rows land in the decode's pinned host pool, index keys in its device pool.
    latent = {row.dst_region for row in program.rows if "indexer" not in row.layer}
    keys = {row.dst_region for row in program.rows if "indexer" in row.layer}
    assert (latent, keys) == ({"host"}, {"device"})


@pytest.mark.parametrize(("source_tp", "destination_tp"), [(4, 2), (2, 4)])
def test_llama_3_70b_across_tensor_parallel_sizes(source_tp: int, destination_tp: int
                                                  ) -> None:
    def side(tp: int, layout: KVCacheLayout) -> Instance:
        plans = [trimmed("llama-3-70b", 2, tp=tp, layout=layout, gpu_mem_bytes=2**23,
                         max_model_len=1024) for _ in range(tp)]
        return Instance(plans, total_kv_heads=8)

    src, dst = side(source_tp, KVCacheLayout.BLNHC), side(destination_tp,
                                                           KVCacheLayout.LBHNC)
    program = moved(src, dst)
    # Each destination rank reads its heads from the source ranks that hold them.
    sources = {rank: {row.src_rank for row in program.rows if row.dst_rank == rank}
               for rank in range(destination_tp)}
    if source_tp > destination_tp:
        assert sources == {0: {0, 1}, 1: {2, 3}}
    else:
        assert sources == {0: {0}, 1: {0}, 2: {1}, 3: {1}}


@pytest.mark.parametrize("tp", [1, 2])
def test_qwen3_next_576_token_blocks_to_544(tp: int) -> None:
    def side(**settings: Any) -> Instance:
        return Instance([trimmed("qwen3-next-80b", 4, tp=tp, gpu_mem_bytes=2**25 // tp,
                                 max_model_len=1200, **settings) for _ in range(tp)])

    src, dst = side(), side(vllm="0.33", prefix_caching=False)
    ours, theirs = src.plans[0], dst.plans[0]
    assert isinstance(ours, hp.KVCachePlan)
    assert isinstance(theirs, hp.KVCachePlan)
    assert {group.spec.block_size for group in ours.groups} == {576}
    assert 544 in {group.spec.block_size for group in theirs.groups}
    program = moved(src, dst, tokens=1100)
    assert any("linear_attn" in row.layer for row in program.rows)


def test_deepseek_v32_vllm_to_sglang_and_back() -> None:
    vllm = Instance([deepseek_plan(hisparse=False, layers=3, layout="LBNHC")])
    # SGLang's plan keeps the fp8 rows as uint8 without naming them: the instance says so.
    sglang = Instance([deepseek_plan(engine="sglang", layers=3)], cache_dtype="fp8_e4m3")
    moved(vllm, sglang)
    moved(sglang, vllm, seed=5)


def test_deepseek_v32_sglang_prefill_to_an_sglang_hisparse_decode() -> None:
    prefill = Instance([deepseek_plan(engine="sglang", layers=2)], cache_dtype="fp8_e4m3")
    decode = Instance([deepseek_plan(engine="sglang", hisparse=True, layers=2)],
                      cache_dtype="fp8_e4m3")
    program = moved(prefill, decode)
    assert {row.dst_region for row in program.rows if "indexer" not in row.layer} == \
        {"hisparse_host"}


def test_deepseek_v32_rows_of_another_format_are_refused() -> None:
    # LBNHC: bf16 rows are read as flat rows, which a block-outermost layout misaligns.
    fp8 = Instance([deepseek_plan(hisparse=False, layers=1, layout="LBNHC")])
    bf16 = Instance([deepseek_plan(hisparse=False, layers=1, kv_dtype="bfloat16",
                                   layout="LBNHC")])
    request = TransferRequest(num_tokens=64, source_blocks=request_blocks(fp8, 64, 0),
                              destination_blocks=request_blocks(bf16, 64, 1))
    with pytest.raises(TransferRefused) as error:
        build_transfer(fp8, bf16, request)
    assert error.value.layer == "model.layers.0.self_attn.attn"
    assert (error.value.source, error.value.destination) == ("fp8_ds_mla", None) or \
        error.value.what in ("latent.dtype", "latent.bytes")


def test_fp8_rows_a_plan_does_not_name_need_each_side_to_say_which_fp8() -> None:
    # Both engines store an e4m3 and an e5m2 cache as the same uint8 rows: moving one into
    # the other passes every byte check, so it is refused unless both sides say, and agree.
    vllm = Instance([deepseek_plan(hisparse=False, layers=1)])
    unnamed = [deepseek_plan(engine="sglang", layers=1)]
    request = TransferRequest(num_tokens=64, source_blocks=request_blocks(vllm, 64, 0),
                              destination_blocks=request_blocks(Instance(unnamed), 64, 1))
    with pytest.raises(TransferRefused) as error:
        build_transfer(vllm, Instance(unnamed), request)
    assert (error.value.what, error.value.destination) == ("cache_dtype", None)
    assert "destination" in str(error.value)
    assert "e5m2" in str(error.value)
    with pytest.raises(TransferRefused) as error:
        build_transfer(vllm, Instance(unnamed, cache_dtype="fp8_e5m2"), request)
    assert (error.value.source, error.value.destination) == ("fp8_e4m3", "fp8_e5m2")
    assert build_transfer(vllm, Instance(unnamed, cache_dtype="fp8"), request).rows
    # A side whose plan names its format (fp8_ds_mla: e4m3) cannot be said to be e5m2.
    contradicted = Instance(vllm.plans, cache_dtype="fp8_e5m2")
    with pytest.raises(TransferRefused, match="agree"):
        build_transfer(contradicted, Instance(unnamed, cache_dtype="fp8_e4m3"), request)


def test_an_unknown_cache_dtype_name_is_refused() -> None:
    with pytest.raises(hp.PlanError, match="cache_dtype"):
        Instance([deepseek_plan(engine="sglang", layers=1)], cache_dtype="fp4")


def test_a_chunked_local_layer_moves_only_the_current_chunk() -> None:
    chunked = {"kind": "chunked_local_attention", "block_size": 16, "num_kv_heads": 2,
               "head_size": 16, "dtype": "bfloat16", "attention_chunk_size": 64}
    layers = {"model.layers.0.self_attn.attn": chunked} | attention_layers(1, 2, first=1)
    src = Instance([vllm_plan(layers, layout="BLNHC", blocks=40)])
    dst = Instance([vllm_plan(layers, layout="LBHNC", blocks=40)])
    request = TransferRequest(num_tokens=150, source_blocks=request_blocks(src, 150, 1),
                              destination_blocks=request_blocks(dst, 150, 2))
    program, wrong = roundtrip(src, dst, request, {"model.layers.0.self_attn.attn": 128})
    assert wrong == 0
    # The full layer moves 160 tokens (its last block), the chunked one tokens 128..159.
    assert program.bytes == (160 + 32) * 2 * 64


def test_qwen3_next_mamba_states_of_another_shape_are_refused() -> None:
    from hisparse_plan.adapters.sglang.request import sglang_request
    from hisparse_plan.models.sglang_settings import SGLangSettings

    arch = load_preset("qwen3-next-80b").architecture
    engine = SGLangSettings(name="sglang", context_length=1200, max_total_tokens=2048,
                            max_running_requests=2)
    data = sglang_request(arch, engine, available_bytes=2**30).model_dump(mode="json")
    keep = tuple(f"model.layers.{i}." for i in range(4))
    data["layers"] = {name: spec for name, spec in data["layers"].items()
                      if name.startswith(keep)}
    sglang = Instance([hp.plan_for_engine(data)])
    vllm = Instance([trimmed("qwen3-next-80b", 4, gpu_mem_bytes=2**25, max_model_len=1200)])
    request = TransferRequest(num_tokens=100, source_blocks=request_blocks(vllm, 100, 1),
                              destination_blocks=request_blocks(sglang, 100, 2))
    with pytest.raises(TransferRefused) as error:
        build_transfer(vllm, sglang, request)
    # vLLM keeps the conv state (kernel - 1, dim), SGLang (dim, kernel - 1).
    assert (error.value.layer, error.value.what) == ("model.layers.0.linear_attn",
                                                     "state0.shape")
    assert (error.value.source, error.value.destination) == ([3, 8192], [8192, 3])


def test_deepseek_v4_caches_are_refused_naming_the_layer() -> None:
    v4 = Instance([trimmed("deepseek-v4-flash", 2, gpu_mem_bytes=2**30, max_model_len=4096)])
    request = TransferRequest(num_tokens=100, source_blocks=request_blocks(v4, 100, 1),
                              destination_blocks=request_blocks(v4, 100, 2))
    with pytest.raises(TransferRefused, match="DeepSeek-V4") as error:
        build_transfer(v4, v4, request)
    assert error.value.layer == "model.layers.0.attn.swa_cache"
