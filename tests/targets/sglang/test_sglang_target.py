"""plan_sglang against figures read off SGLang 0.5.23's own pools (built on CPU), its sizing
formulas, its refusals, and a property: every page and view lies inside its allocation and no
two blocks share a byte. SGLang itself is not imported."""

from __future__ import annotations

import json
from itertools import pairwise
from typing import Any

import pytest
from hypothesis import given, settings

from hisparse_plan.checking import check_plan
from hisparse_plan.errors import CapacityError, PlanError, UnsupportedRequestError
from hisparse_plan.models.plan import KVCacheTensor
from hisparse_plan.models.pools import BUFFER_DTYPE_SIZE, BufferView, Pool
from hisparse_plan.models.request import PlanRequest
from hisparse_plan.models.sglang_plan import SGLangPlan
from hisparse_plan.targets.sglang import plan_sglang
from support.golden import GOLDEN
from support.sglang_requests import (
    GIB,
    INDEXER,
    dsa_layers,
    golden,
    latent,
    mamba,
    mha,
    pool,
    request,
    small_requests,
    swa,
    tensor,
)


def view(plan: SGLangPlan, pool_name: str, name: str) -> BufferView:
    return next(v for v in tensor(plan, pool_name).views if v.name == name)


def shape(v: BufferView) -> tuple[list[int], list[int], int]:
    return list(v.shape), list(v.strides), v.storage_offset


# --- MHA ---------------------------------------------------------------------------------


def test_mha_fused_halves_match_sglang() -> None:
    """MHATokenToKVPool(size=1024, page_size=64, bf16, 8 heads of 128, 2 layers)."""
    plan = plan_sglang(request({"a": mha(), "b": mha()}, page_size=64, max_total_tokens=1024))
    assert plan.max_total_num_tokens == 1024
    kv = pool(plan, "kv")
    assert (kv.allocation, kv.size, kv.num_blocks, kv.block_tokens, kv.padding_blocks) == (
        "per_layer", 4_456_448, 17, 64, 1)
    assert shape(view(plan, "kv", "k_buffer")) == ([1088, 8, 128], [1024, 128, 1], 0)
    assert shape(view(plan, "kv", "v_buffer")) == ([1088, 8, 128], [1024, 128, 1], 1_114_112)
    t = tensor(plan, "kv")
    assert (t.layer_stride, t.block_stride, t.offset) == (0, 131_072, 0)
    assert t.ranges is not None
    assert [(r.offset, r.size) for r in t.ranges] == [(0, 131_072), (2_228_224, 131_072)]
    assert t.layers == ["a", "b"]
    assert plan.budget.cell_size_bytes == 2 * 8 * 256 * 2


def test_mha_fp8_is_stored_as_bytes() -> None:
    plan = plan_sglang(request({"a": mha()}, page_size=64, max_total_tokens=1024,
                               kv_cache_dtype="fp8_e4m3"))
    assert pool(plan, "kv").size == 2_228_224
    assert view(plan, "kv", "k_buffer").dtype == "uint8"


def test_mha_separate_k_and_v_when_head_sizes_differ() -> None:
    plan = plan_sglang(request({"a": mha(head_size_v=64)}, page_size=64, max_total_tokens=1024))
    assert shape(view(plan, "kv", "k_buffer")) == ([1088, 8, 128], [1024, 128, 1], 0)
    assert shape(view(plan, "kv_v", "v_buffer")) == ([1088, 8, 64], [512, 64, 1], 0)
    assert pool(plan, "kv_v").size == 1088 * 512 * 2


def test_page_size_one_by_default() -> None:
    plan = plan_sglang(golden("regular_llama3_8b_bf16", context_length=8192))
    assert plan.page_size == 1
    # 32 layers x 8 heads x 256 elements x 2 bytes per token
    assert plan.budget.cell_size_bytes == 131_072
    assert plan.max_total_num_tokens == 60 * GIB // 131_072
    assert view(plan, "kv", "k_buffer").shape[0] == plan.max_total_num_tokens + 1


# --- MLA / DSA ---------------------------------------------------------------------------


def test_mla_latent_rows() -> None:
    plan = plan_sglang(request({"a": latent(), "b": latent()}, page_size=64,
                               max_total_tokens=1024))
    assert shape(view(plan, "kv", "kv_buffer")) == ([1088, 1, 576], [576, 576, 1], 0)
    assert 2 * pool(plan, "kv").size == 2_506_752


def test_dsa_656_byte_rows_and_index_keys() -> None:
    plan = plan_sglang(request(dsa_layers(2), max_total_tokens=1024))
    assert plan.page_size == 64
    assert shape(view(plan, "kv", "kv_buffer")) == ([1088, 1, 656], [656, 656, 1], 0)
    assert view(plan, "kv", "kv_buffer").dtype == "uint8"
    assert pool(plan, "kv").size == 713_728
    assert shape(view(plan, "index", "index_k")) == ([17, 8448], [8448, 1], 0)
    assert pool(plan, "index").size == 143_616
    assert 2 * (pool(plan, "kv").size + pool(plan, "index").size) == 1_714_688
    assert tensor(plan, "index").layers == ["l0.indexer", "l1.indexer"]


def test_dsa_trtllm_keeps_raw_576_byte_rows() -> None:
    plan = plan_sglang(request(dsa_layers(2), max_total_tokens=1024, dsa_backend="trtllm"))
    assert view(plan, "kv", "kv_buffer").shape == [1088, 1, 576]
    assert 2 * (pool(plan, "kv").size + pool(plan, "index").size) == 1_540_608


def test_deepseek_v32_cell_size() -> None:
    plan = plan_sglang(golden("deepseek_v32_fp8", context_length=163840))
    assert plan.budget.cell_size_bytes == 48_068
    assert plan.max_total_num_tokens == 60 * GIB // 48_068 // 64 * 64
    trtllm = plan_sglang(golden("deepseek_v32_fp8", context_length=163840, dsa_backend="trtllm"))
    assert trtllm.budget.cell_size_bytes == 43_188


def test_hisparse_pools() -> None:
    """HiSparseDSATokenToKVPool(size=1024, ratio 4) and its layer-first host pool."""
    plan = plan_sglang(request(dsa_layers(2), max_total_tokens=1024, enable_hisparse=True,
                               hisparse_host_to_device_ratio=4))
    assert view(plan, "kv", "kv_buffer").shape == [1088, 1, 656]
    assert view(plan, "index", "index_k").shape == [65, 8448]
    host = pool(plan, "hisparse_host")
    assert (host.location, host.allocation, host.num_blocks) == ("host", "whole", 65)
    assert shape(view(plan, "hisparse_host", "host_kv_buffer")) == (
        [2, 4160, 1, 656], [2_728_960, 656, 656, 1], 0)
    t = tensor(plan, "hisparse_host")
    assert (t.host_resident, t.layer_stride, t.block_stride) == (True, 2_728_960, 64 * 656)
    assert not tensor(plan, "kv").host_resident
    assert plan.hisparse is not None
    assert (plan.hisparse.host_tokens, plan.hisparse.logical_tokens) == (4160, 4096)
    assert plan.hisparse.hot_rows_per_request == 4096 + 64
    assert plan.budget.cell_size_bytes == 2 * (656 + 132 * 4)
    assert plan.capacity.steady_state_concurrency is not None


# --- SWA and Mamba -------------------------------------------------------------------------


def test_swa_two_sub_pools() -> None:
    """SWAKVPool(size=1024, size_swa=512, page 64): full layer 1, window layers 0 and 2."""
    layers = {"w0": swa(128), "f1": mha(), "w2": swa(128)}
    plan = plan_sglang(request(layers, page_size=64, max_total_tokens=1024,
                               swa_full_tokens_ratio=0.5))
    assert view(plan, "kv", "k_buffer").shape == [1088, 8, 128]
    assert shape(view(plan, "swa", "k_buffer")) == ([576, 8, 128], [1024, 128, 1], 0)
    assert tensor(plan, "swa").layers == ["w0", "w2"]
    assert tensor(plan, "kv").layers == ["f1"]
    # the K figures SGLang reports: 1 x 1088 x 2048 + 2 x 576 x 2048
    assert pool(plan, "kv").size // 2 + 2 * (pool(plan, "swa").size // 2) == 4_587_520


def test_swa_float_cell_size_as_sglang() -> None:
    plan = plan_sglang(golden("regular_gpt_oss_120b", context_length=131072))
    full = 18 * 8 * 128 * 2
    cell = full + 0.8 * full
    assert plan.budget.cell_size_bytes == cell
    assert plan.max_total_num_tokens == int(60 * GIB // cell)
    assert view(plan, "swa", "k_buffer").shape[0] == int(plan.max_total_num_tokens * 0.8) + 1




def test_mamba_slot_pools() -> None:
    """MambaPool(size=16) over Mamba2 states conv (1024, 3) bf16, temporal (8, 64, 128) fp32."""
    layers = {"m0": mamba(), "a1": mha(), "m2": mamba()}
    plan = plan_sglang(request(layers, max_mamba_cache_size=16))
    assert shape(view(plan, "mamba_conv0", "conv[0]")) == (
        [2, 17, 1024, 3], [52_224, 3072, 3, 1], 0)
    assert shape(view(plan, "mamba_temporal", "temporal")) == (
        [2, 17, 8, 64, 128], [1_114_112, 65_536, 8192, 128, 1], 0)
    assert view(plan, "mamba_temporal", "temporal").dtype == "float32"
    sizes = pool(plan, "mamba_conv0").size + pool(plan, "mamba_temporal").size
    assert sizes == 9_121_792
    conv = pool(plan, "mamba_conv0")
    assert (conv.num_blocks, conv.block_tokens, conv.padding_blocks, conv.allocation) == (
        17, 1, 1, "whole")
    assert plan.max_running_requests == 16 // 5
    assert tensor(plan, "kv").layers == ["a1"]
    assert plan.budget.cell_size_bytes == 8 * 256 * 2  # the attention layer alone


def test_mamba_states_come_off_the_budget_first() -> None:
    layers = {"m0": mamba(), "a1": mha()}
    available = 10 * GIB
    plan = plan_sglang(request(layers, available))
    slot = 1024 * 3 * 2 + 8 * 64 * 128 * 4
    rest = available / GIB
    slots = int((rest * 0.9 / 1.9 * GIB - 0 - slot) // slot)
    kv = int((rest - (slots + 1) * slot / GIB) * GIB)
    assert plan.budget.available_bytes == kv
    assert pool(plan, "mamba_conv0").num_blocks == slots + 1
    assert plan.max_total_num_tokens == kv // (8 * 256 * 2)


def test_qwen3_next_conv_stored_dim_first() -> None:
    plan = plan_sglang(golden("regular_qwen3_next_80b_mamba", context_length=262144))
    v = view(plan, "mamba_conv0", "conv[0]")
    assert v.shape[2:] == [8192, 3]
    assert v.shape[0] == 36
    assert tensor(plan, "kv").layers[0] == "model.layers.3.self_attn.attn"


# --- budget, requests, request table ------------------------------------------------------


def test_budget_formula_bit_for_bit() -> None:
    pre, post, fraction = 140_000_000_000, 80_123_456_789, 0.886
    plan = plan_sglang(request({"a": mha()}, 0, pre_model_load_free_bytes=pre,
                               post_weights_free_bytes=post, mem_fraction_static=fraction))
    rest = post / GIB - pre / GIB * (1 - fraction)
    assert plan.budget.available_bytes == int(rest * GIB)
    assert plan.budget.mem_fraction_static == fraction


def test_budget_formula_needs_the_fraction() -> None:
    with pytest.raises(UnsupportedRequestError, match="mem_fraction_static") as info:
        plan_sglang(request({"a": mha()}, 0, pre_model_load_free_bytes=GIB,
                            post_weights_free_bytes=GIB))
    assert info.value.field == "engine.mem_fraction_static"


def test_max_running_requests_rules() -> None:
    # estimate: int(tokens / context * 512) clamped to [2048, 4096], at most tokens // 2
    plan = plan_sglang(request({"a": mha()}, max_total_tokens=100_000, context_length=4096))
    assert plan.max_running_requests == min(max(int(100_000 / 4096 * 512), 2048), 4096, 50_000)
    small = plan_sglang(request({"a": mha()}, max_total_tokens=1000))
    assert small.max_running_requests == 500
    given = plan_sglang(request({"a": mha()}, max_total_tokens=1000, max_running_requests=16))
    assert given.max_running_requests == 16
    assert given.req_to_token.shape == [17, 4100]
    assert given.req_to_token.dtype == "int32"


def test_max_total_tokens_is_floored_to_a_page() -> None:
    plan = plan_sglang(request({"a": mha()}, page_size=64, max_total_tokens=1000))
    assert plan.max_total_num_tokens == 960


def test_capacity_is_bounded_by_requests_and_pools() -> None:
    plan = plan_sglang(request({"a": mha()}, page_size=64, max_total_tokens=1024 * 10,
                               context_length=1000))
    assert plan.capacity.max_concurrency == 10_240 / 1024
    assert plan.capacity.steady_state_concurrency is None
    few = plan_sglang(request({"a": mha()}, page_size=64, max_total_tokens=1024 * 10,
                              context_length=1000, max_running_requests=3))
    assert few.capacity.max_concurrency == 3


# --- refusals ------------------------------------------------------------------------------


def test_refuses_no_budget() -> None:
    with pytest.raises(CapacityError, match="no memory is left"):
        plan_sglang(request({"a": mha()}, 0, pre_model_load_free_bytes=100 * GIB,
                            post_weights_free_bytes=5 * GIB, mem_fraction_static=0.9))


def test_refuses_a_budget_below_one_page() -> None:
    with pytest.raises(CapacityError, match="holds no page"):
        plan_sglang(request({"a": mha()}, 63 * 4096, page_size=64))


def test_refuses_a_single_token_pool() -> None:
    with pytest.raises(CapacityError, match="no request"):
        plan_sglang(request({"a": mha()}, max_total_tokens=1))


def test_refuses_a_window_pool_below_one_request() -> None:
    layers = {"w0": swa(512), "f1": mha()}
    with pytest.raises(CapacityError, match="cannot hold one request") as info:
        plan_sglang(request(layers, page_size=64, max_total_tokens=640))
    assert info.value.field == "engine.swa_full_tokens_ratio"


def test_a_dsa_page_other_than_64_is_rewritten_to_64() -> None:
    """SGLang's _deepseek_family_overrides sets a DSA model's page to 64 over the given one
    (with a warning), so a plan with page 32 asked is SGLang's 64-token plan."""
    assert plan_sglang(request(dsa_layers(1), page_size=32)).page_size == 64


def test_refuses_hot_buffer_below_top_k() -> None:
    with pytest.raises(PlanError, match="expected at least 2048, got 1024") as info:
        # A budget of pools SGLang builds: its decode step refuses the buffer after them.
        plan_sglang(request(dsa_layers(1), available=2 << 30, enable_hisparse=True,
                            hisparse_device_buffer_size=1024))
    assert info.value.field == "engine.hisparse_device_buffer_size"


def test_refuses_hisparse_without_dsa() -> None:
    with pytest.raises(UnsupportedRequestError, match="enable_hisparse"):
        plan_sglang(request({"a": mha()}, enable_hisparse=True))


CHUNKED = {"kind": "chunked_local_attention", "block_size": 16, "num_kv_heads": 8,
           "head_size": 128, "attention_chunk_size": 8192}
"""A Llama-4 chunked-local layer: SGLang's window pool takes it
(tests/targets/sglang/test_sglang_llama4.py)."""


@pytest.mark.parametrize(
    ("layers", "match"),
    [
        ({"a": latent(), "w": swa(128)}, "MLA beside sliding-window"),
        ({"a": latent(), "m": mamba()}, "MLA beside Mamba"),
        ({"w": swa(128), "m": mamba(), "a": mha()}, "Mamba beside sliding-window"),
        ({"w": swa(128)}, "sliding-window layers only"),
        ({"a": mha(), "b": mha(heads=4)}, "one head shape"),
        ({"w": swa(128), "v": swa(256), "a": mha()}, "one window"),
        ({"c": CHUNKED}, "no full-attention layer"),
        ({"c": CHUNKED, "a": latent()}, "full or chunked-local attention"),
        ({"v4": {"kind": "sliding_window_mla", "block_size": 64, "head_size": 512,
                 "dtype": "uint8", "sliding_window": 128, "model_version": "deepseek_v4",
                 "state_content_bytes": 584}, "a": mha()}, "DeepSeek-V4"),
        ({**dsa_layers(2), "extra.indexer": INDEXER}, "one per sparse layer"),
    ],
)
def test_refuses_what_sglang_does_not_run(layers: dict[str, Any], match: str) -> None:
    with pytest.raises(UnsupportedRequestError, match=match):
        plan_sglang(request(layers))


def test_refuses_vllms_decode_context_parallelism_field() -> None:
    req = golden("modes_deepseek_v32_dcp8", context_length=163840)
    with pytest.raises(UnsupportedRequestError,
                       match=r"expected 1, and engine\.dcp_size for SGLang's, got 8") as info:
        plan_sglang(req)
    assert info.value.field == "scheduler.decode_context_parallel_size"


def test_refuses_speculative_decoding_and_vllm_requests() -> None:
    with pytest.raises(UnsupportedRequestError, match="speculative"):
        plan_sglang(request({"a": mha()}, speculative_num_draft_tokens=3))
    vllm = PlanRequest.model_validate({
        "layers": {"a": mha()}, "model": {"max_model_len": 16},
        "device": {"available_bytes": GIB}})
    with pytest.raises(PlanError, match="engine"):
        plan_sglang(vllm)


# --- property: pages and views inside their allocations, blocks disjoint ------------------


def _intervals(t: KVCacheTensor, p: Pool) -> dict[tuple[int, int], list[tuple[int, int]]]:
    """(allocation, block) -> the byte intervals of that block's pages in that allocation."""
    assert t.ranges is not None
    out: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for layer in range(len(t.layers)):
        alloc = layer if p.allocation == "per_layer" else 0
        for block in range(p.num_blocks):
            for r in t.ranges:
                start = t.offset + layer * t.layer_stride + block * t.block_stride + r.offset
                out.setdefault((alloc, block), []).append((start, start + r.size))
    return out


def _view_span(v: BufferView) -> tuple[int, int]:
    size = BUFFER_DTYPE_SIZE[v.dtype]
    last = v.storage_offset + sum((n - 1) * s for n, s in zip(v.shape, v.strides, strict=True))
    return v.storage_offset * size, (last + 1) * size


def check_layout(plan: SGLangPlan) -> None:
    """Every page range inside its allocation, no two (layer, block, range) pages of one
    allocation sharing a byte, every view inside its allocation."""
    pools = {p.name: p for p in plan.pools}
    assert len(pools) == len(plan.pools)
    for p in plan.pools:
        allocations: dict[int, list[tuple[int, int, int]]] = {}
        for t in (t for t in plan.tensors if t.pool == p.name):
            assert t.size == p.size
            assert t.host_resident == (p.location == "host")
            if p.allocation == "per_layer":
                assert t.layer_stride == 0
            for (alloc, block), pages in _intervals(t, p).items():
                allocations.setdefault(alloc, []).extend((lo, hi, block) for lo, hi in pages)
            for v in t.views:
                lo, hi = _view_span(v)
                assert 0 <= lo < hi <= p.size, (p.name, v.name)
        for alloc, spans in allocations.items():
            spans.sort()
            for lo, hi, _ in spans:
                assert 0 <= lo < hi <= p.size, p.name
            for (_, hi, block), (lo, _, other) in pairwise(spans):
                assert hi <= lo, (p.name, alloc, block, other)




@settings(max_examples=100)
@given(small_requests())
def test_pages_and_views_inside_their_allocations(req: PlanRequest) -> None:
    plan = plan_sglang(req)
    check_layout(plan)
    check_plan(plan)


# --- SGLang's own runs (REFERENCE.md: SGLang 0.5.23's configurator on meta tensors) ---------

PRE, MFS = 149_250_113_536, 0.9


def per_rank(layers: int, **spec: Any) -> dict[str, Any]:
    return {f"l{i}": spec for i in range(layers)}


def test_reference_llama31_8b_tp8() -> None:
    plan = plan_sglang(request(per_rank(32, **mha(heads=1)), 0, context_length=8192,
                               pre_model_load_free_bytes=PRE,
                               post_weights_free_bytes=147_102_629_888, mem_fraction_static=MFS))
    assert plan.budget.available_bytes == 132_177_618_534
    assert (plan.max_total_num_tokens, plan.max_running_requests) == (8_067_481, 4096)
    assert plan.req_to_token.shape == [4097, 8196]
    assert view(plan, "kv", "k_buffer").shape == [8_067_482, 1, 128]


def test_reference_llama31_8b_tp1_small_fp8() -> None:
    plan = plan_sglang(request(per_rank(32, **mha()), 1_073_754_169, page_size=64,
                               kv_cache_dtype="fp8_e4m3"))
    assert (plan.max_total_num_tokens, plan.max_running_requests) == (16_384, 2048)
    assert plan.budget.cell_size_bytes == 65_536
    assert shape(view(plan, "kv", "k_buffer")) == ([16_448, 8, 128], [1024, 128, 1], 0)


@pytest.mark.parametrize(
    ("engine", "tokens", "requests", "cell", "index_pages"),
    [
        ({"mem_fraction_static": MFS, "pre_model_load_free_bytes": PRE,
          "post_weights_free_bytes": 63_350_767_616, "context_length": 8192},
         1_007_424, 4096, 48_068, 15_742),
        ({"mem_fraction_static": MFS, "pre_model_load_free_bytes": PRE,
          "post_weights_free_bytes": 63_350_767_616, "context_length": 8192,
          "dsa_backend": "trtllm"}, 1_121_216, 4096, 43_188, 17_520),
        ({"mem_fraction_static": MFS, "pre_model_load_free_bytes": PRE,
          "post_weights_free_bytes": 63_350_767_616, "context_length": 8192,
          "enable_hisparse": True, "hisparse_device_buffer_size": 4096},
         862_848, 4096, 56_120, 26_965),
        ({"max_running_requests": 8}, 44_672, 8, 48_068, 699),
        ({"enable_hisparse": True, "hisparse_host_to_device_ratio": 4},
         29_696, 3712, 72_224, 1857),
    ],
)
def test_reference_deepseek_v32(
    engine: dict[str, Any], tokens: int, requests: int, cell: int, index_pages: int
) -> None:
    available = 0 if "pre_model_load_free_bytes" in engine else 2 * GIB
    plan = plan_sglang(request(dsa_layers(61), available, kv_cache_dtype="fp8_e4m3", **engine))
    assert (plan.max_total_num_tokens, plan.max_running_requests) == (tokens, requests)
    assert plan.budget.cell_size_bytes == cell
    assert view(plan, "index", "index_k").shape == [index_pages, 8448]
    if plan.hisparse is not None:
        ratio = plan.hisparse.host_to_device_ratio
        assert view(plan, "hisparse_host", "host_kv_buffer").shape == [
            61, tokens * ratio + 64, 1, 656]


def test_reference_glm5_tp8() -> None:
    plan = plan_sglang(request(dsa_layers(78), 0, context_length=8192, mem_fraction_static=MFS,
                               pre_model_load_free_bytes=PRE,
                               post_weights_free_bytes=54_760_833_024))
    assert plan.budget.cell_size_bytes == 61_464
    assert plan.budget.available_bytes == 39_835_821_670
    assert (plan.max_total_num_tokens, plan.max_running_requests) == (648_064, 4096)
    assert view(plan, "index", "index_k").shape == [10_127, 8448]


def gpt_oss(heads: int) -> dict[str, Any]:
    layers: dict[str, Any] = {}
    for i in range(36):
        layers[f"l{i}"] = swa(128, heads, 64) if i % 2 == 0 else mha(heads, 64)
    return layers


def test_reference_gpt_oss_120b_tp8() -> None:
    plan = plan_sglang(request(gpt_oss(1), 0, context_length=8192, mem_fraction_static=MFS,
                               pre_model_load_free_bytes=PRE,
                               post_weights_free_bytes=140_660_178_944))
    assert plan.budget.cell_size_bytes == 8294.4
    assert plan.budget.available_bytes == 125_735_167_590
    assert (plan.max_total_num_tokens, plan.max_running_requests) == (15_159_043, 4096)
    assert view(plan, "swa", "k_buffer").shape == [12_127_235, 1, 64]


def test_reference_gpt_oss_120b_tp1_small() -> None:
    plan = plan_sglang(request(gpt_oss(8), 2 * GIB, swa_full_tokens_ratio=0.5))
    assert (plan.max_total_num_tokens, plan.max_running_requests) == (38_836, 4096)
    assert view(plan, "swa", "k_buffer").shape == [19_419, 8, 64]


def qwen3_next(tp: int) -> dict[str, Any]:
    layers: dict[str, Any] = {}
    for i in range(48):
        if i % 4 == 3:
            layers[f"l{i}"] = mha(2 // min(tp, 2), 256)
        else:
            layers[f"l{i}"] = {"kind": "mamba", "block_size": 4096,
                               "state_shapes": [[3, 8192 // tp], [32 // tp, 128, 128]],
                               "state_dtypes": ["bfloat16", "bfloat16"]}
    return layers


def test_reference_qwen3_next_tp8() -> None:
    plan = plan_sglang(request(qwen3_next(8), 0, context_length=8192, mem_fraction_static=MFS,
                               pre_model_load_free_bytes=PRE,
                               post_weights_free_bytes=127_775_277_056))
    assert pool(plan, "mamba_conv0").num_blocks == 5533 + 1
    assert plan.budget.available_bytes == 59_400_857_190
    assert (plan.max_total_num_tokens, plan.max_running_requests) == (4_834_054, 1106)
    assert plan.budget.cell_size_bytes == 12_288
    assert shape(view(plan, "mamba_temporal", "temporal")) == (
        [36, 5534, 4, 128, 128], [362_676_224, 65_536, 16_384, 128, 1], 0)


def test_reference_qwen3_next_tp1_small() -> None:
    plan = plan_sglang(request(qwen3_next(1), 4 * GIB, max_mamba_cache_size=30))
    assert plan.budget.available_bytes == 1_899_692_032
    assert (plan.max_total_num_tokens, plan.max_running_requests) == (77_298, 6)
    assert view(plan, "mamba_conv0", "conv[0]").shape == [36, 31, 8192, 3]


def test_vllm_only_sections_are_refused_not_ignored() -> None:
    data = json.loads((GOLDEN / "deepseek_v32_fp8.request.json").read_text())
    data["engine"] = {"name": "sglang", "context_length": 163840}
    with pytest.raises(UnsupportedRequestError, match="enable_hisparse") as caught:
        plan_sglang(PlanRequest.model_validate(data))
    assert caught.value.field == "hisparse"
    data["hisparse"] = None
    data["device"]["num_blocks_override"] = 1000
    with pytest.raises(UnsupportedRequestError, match="max_total_tokens") as caught:
        plan_sglang(PlanRequest.model_validate(data))
    assert caught.value.field == "device.num_blocks_override"
