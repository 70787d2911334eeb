"""plan_sglang for DeepSeek-V4-Flash against what SGLang 0.5.23 itself computes: the figures of
its DSV4PoolConfigurator and the buffers of its DeepSeekV4TokenToKVPool, read off SGLang's own
objects (built on meta tensors) by the reference harness for the cases `dsv4_flash_tp8_h200`
and `dsv4_flash_tp1_small` and a few variants of the latter. The figures are literals here;
SGLang is not imported."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hisparse_plan.checking import check_plan
from hisparse_plan.errors import CapacityError, UnsupportedRequestError
from hisparse_plan.models.plan import KVCacheTensor
from hisparse_plan.models.request import PlanRequest
from hisparse_plan.models.sglang_plan import SGLangPlan
from hisparse_plan.presets import Settings, build_request, load_preset
from hisparse_plan.targets.sglang import plan_sglang
from support.sglang_requests import pool, tensor

GIB = 1 << 30
TP8: dict[str, Any] = {"mem_fraction_static": 0.9, "pre_model_load_free_bytes": 149_250_113_536,
       "post_weights_free_bytes": 127_775_277_056, "context_length": 8192}
C4_LAYERS = list(range(2, 43, 2))
C128_LAYERS = list(range(3, 42, 2))


def v4_request(available: int = 0, **engine: Any) -> PlanRequest:
    """The deepseek-v4-flash preset's layers (as vLLM registers them) with SGLang settings."""
    engine.setdefault("context_length", 4096)
    arch = load_preset("deepseek-v4-flash").architecture
    data = build_request(arch, Settings(max_model_len=engine["context_length"])).model_dump()
    data["device"]["available_bytes"] = available
    data["engine"] = {"name": "sglang", **engine}
    return PlanRequest.model_validate(data)




def layer_ids(t: KVCacheTensor) -> list[int]:
    """SGLang's layer id of each layer of a tensor: the decoder layer its cache belongs to."""
    ids = []
    for name in t.layers:
        found = re.search(r"layers\.(\d+)\.", name)
        assert found is not None, name
        ids.append(int(found.group(1)))
    return ids


POOL_TOKENS = {
    "v4_swa": "swa_tokens", "v4_c4": "c4_tokens", "v4_c128": "c128_tokens",
    "v4_index_c4": "c4_index_tokens", "v4_state_c4": "c4_state_rows",
    "v4_index_state_c4": "c4_state_rows", "v4_state_c128": "c128_state_rows",
}


def pool_tokens(plan: SGLangPlan, name: str) -> int:
    """The size SGLang's pool object reports (what the reference report's `tokens` shows)."""
    assert plan.deepseek_v4 is not None
    return int(getattr(plan.deepseek_v4, POOL_TOKENS[name]))


# (pool, layers, tokens, buffer name, dtype, shape, storage bytes) of SGLang's run; every buffer
# is contiguous (strides [shape[1], 1]) at storage offset 0, one allocation per layer.
TP8_POOLS = [
    ("v4_swa", list(range(43)), 1_553_920, "kv_buffer", "uint8", [6071, 149_760], 909_192_960),
    ("v4_c4", C4_LAYERS, 3_885_184, "kv_buffer", "uint8", [60_710, 37_440], 2_272_982_400),
    ("v4_c128", C128_LAYERS, 121_412, "kv_buffer", "uint8", [60_834, 1728], 105_121_152),
    ("v4_index_c4", C4_LAYERS, 3_885_184, "index_k", "uint8", [60_710, 8448], 512_878_080),
    ("v4_state_c4", C4_LAYERS, 48_572, "kv_score", "float32", [48_572, 2048], 397_901_824),
    ("v4_index_state_c4", C4_LAYERS, 48_572, "kv_score", "float32", [48_572, 512],
     99_475_456),
    ("v4_state_c128", C128_LAYERS, 33_152, "kv_score", "float32", [33_152, 1024],
     135_790_592),
]
TP1_POOLS = [
    ("v4_swa", list(range(43)), 22_272, "kv_buffer", "uint8", [88, 149_760], 13_178_880),
    ("v4_c4", C4_LAYERS, 55_680, "kv_buffer", "uint8", [874, 37_440], 32_722_560),
    ("v4_c128", C128_LAYERS, 1740, "kv_buffer", "uint8", [998, 1728], 1_724_544),
    ("v4_index_c4", C4_LAYERS, 55_680, "index_k", "uint8", [874, 8448], 7_383_552),
    ("v4_state_c4", C4_LAYERS, 708, "kv_score", "float32", [708, 2048], 5_799_936),
    ("v4_index_state_c4", C4_LAYERS, 708, "kv_score", "float32", [708, 512], 1_449_984),
    ("v4_state_c128", C128_LAYERS, 33_152, "kv_score", "float32", [33_152, 1024], 135_790_592),
]
CASES: dict[str, tuple[int, dict[str, Any], int, int, int, list[int], int, list[Any]]] = {
    # name: (device.available_bytes, engine, available_bytes, max_total_num_tokens,
    #        max_running_requests, req_to_token, swa tokens, pools)
    "dsv4_flash_tp8_h200": (0, TP8, 112_850_265_702, 15_540_736, 256, [257, 8196],
                            1_553_920, TP8_POOLS),
    "dsv4_flash_tp1_small": (4 * GIB, {}, 4 * GIB, 222_720, 256, [257, 4100], 22_272,
                             TP1_POOLS),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_sglangs_own_pools(case: str) -> None:
    device, engine, available, tokens, requests, table, swa, pools = CASES[case]
    plan = plan_sglang(v4_request(device, **engine))
    check_plan(plan)
    assert plan.page_size == 256
    assert plan.budget.available_bytes == available
    assert (plan.max_total_num_tokens, plan.max_running_requests) == (tokens, requests)
    assert (plan.req_to_token.shape, plan.req_to_token.dtype) == (table, "int32")
    assert plan.deepseek_v4 is not None
    assert (plan.deepseek_v4.swa_tokens, plan.deepseek_v4.swa_full_tokens_ratio) == (swa, 0.1)
    assert sorted(p.name for p in plan.pools) == sorted(name for name, *_ in pools)
    for name, layers, pool_size, buffer, dtype, shape, nbytes in pools:
        p, t = pool(plan, name), tensor(plan, name)
        assert pool_tokens(plan, name) == pool_size, name
        assert sorted(layer_ids(t)) == layers, name
        assert (p.location, p.allocation, p.size) == ("device", "per_layer", nbytes), name
        assert t.layer_stride == 0
        # one view, over each layer's own allocation (SGLang's buffer of every layer id)
        (view,) = t.views
        assert (view.name, view.dtype, view.shape) == (buffer, dtype, shape), name
        assert (view.strides, view.storage_offset) == ([shape[1], 1], 0), name


def test_budget_split_figures() -> None:
    """SGLang's coefficient (bytes per full token, window share at 0.1 included) and the c128
    state rings it reserves for the 256 requested requests before the split."""
    plan = plan_sglang(v4_request(0, **TP8))
    v4 = plan.deepseek_v4
    assert v4 is not None
    # 0.1 * (43 x 585.0 + 8/256 x (8192 + 2048) x 21) + 21 x (585.0/4 + 132/4) + 20 x 864.0/128
    assert v4.bytes_per_full_token == 7086.75 == plan.budget.cell_size_bytes
    assert v4.fixed_bytes == 33_152 * 1024 * 4 * 20
    assert (v4.c4_tokens, v4.c128_tokens, v4.c4_index_tokens) == (3_885_184, 121_412, 3_885_184)


def test_pages_and_blocks() -> None:
    """Blocks: window pages (256 tokens), c4 pages (64 slots), c128 pages (2 slots), c4 state
    rings (8 rows) per window page, c128 rings (128 rows) per request slot; block 0 pads."""
    plan = plan_sglang(v4_request(4 * GIB))
    got = {p.name: (p.num_blocks, p.block_tokens, p.padding_blocks) for p in plan.pools}
    assert got == {
        "v4_swa": (88, 256, 1), "v4_c4": (874, 64, 1), "v4_index_c4": (874, 64, 1),
        "v4_c128": (998, 2, 1), "v4_state_c4": (88, 8, 1), "v4_index_state_c4": (88, 8, 1),
        "v4_state_c128": (257, 128, 1),
    }
    assert tensor(plan, "v4_c4").block_stride == 37_440
    assert tensor(plan, "v4_state_c128").block_stride == 128 * 1024 * 4


@pytest.mark.parametrize(
    ("available", "engine", "tokens", "requests", "swa", "c4_rows", "c128_rows"),
    [
        # SGLang's own runs of dsv4_flash_tp1_small with one setting changed
        (4 * GIB, {"max_running_requests": 64}, 506_880, 64, 50_688, 1596, 8576),
        (4 * GIB, {"swa_full_tokens_ratio": 0.2}, 153_600, 256, 30_720, 972, 33_152),
        (4 * GIB, {"max_total_tokens": 100_000}, 99_840, 256, 9984, 324, 33_152),
        (2_900_000_000, {}, 25_856, 256, 2560, 92, 33_152),
        (2_800_000_000, {}, 11_776, 256, 1024, 44, 33_152),
        (3 * GIB, {"swa_full_tokens_ratio": 0.5, "context_length": 1024}, 25_344, 256, 12_544,
         404, 33_152),
    ],
)
def test_matches_sglang_variants(
    available: int, engine: dict[str, Any], tokens: int, requests: int, swa: int,
    c4_rows: int, c128_rows: int,
) -> None:
    plan = plan_sglang(v4_request(available, **engine))
    check_plan(plan)
    v4 = plan.deepseek_v4
    assert v4 is not None
    assert (plan.max_total_num_tokens, plan.max_running_requests) == (tokens, requests)
    assert (v4.swa_tokens, v4.c4_state_rows, v4.c128_state_rows) == (swa, c4_rows, c128_rows)
    assert tensor(plan, "v4_swa").views[0].shape[0] == (swa + 256) // 256


@pytest.mark.parametrize(
    ("available", "engine"),
    [
        (2_744_000_000, {}),  # SGLang: "SWA pool (256 tokens) cannot hold even one request"
        (8 * GIB, {"max_running_requests": 1000}),  # the c128 rings take the whole budget
    ],
)
def test_refuses_what_sglang_cannot_hold(available: int, engine: dict[str, Any]) -> None:
    with pytest.raises(CapacityError, match="window pool cannot hold one request") as info:
        plan_sglang(v4_request(available, **engine))
    assert info.value.field == "engine.swa_full_tokens_ratio"


@pytest.mark.parametrize(
    ("engine", "field", "match"),
    [
        ({"page_size": 64}, "engine.page_size", "expected 256 or null, got 64"),
        ({"kv_cache_dtype": "bfloat16"}, "engine.kv_cache_dtype", "got bfloat16"),
        ({"dsa_backend": "trtllm"}, "engine.dsa_backend", "expected null, got trtllm"),
        ({"speculative_num_draft_tokens": 2}, "engine.speculative_num_draft_tokens",
         "speculative"),
    ],
)
def test_refuses_settings_not_planned(engine: dict[str, Any], field: str, match: str) -> None:
    with pytest.raises(UnsupportedRequestError, match=match) as info:
        plan_sglang(v4_request(4 * GIB, **engine))
    assert info.value.field == field


def _edited(edit: dict[str, Any | None]) -> PlanRequest:
    data = v4_request(4 * GIB).model_dump()
    for name, spec in edit.items():
        if spec is None:
            del data["layers"][name]
        else:
            data["layers"][name] = spec
    return PlanRequest.model_validate(data)


STATE = "model.layers.2.attn.compressor.state_cache"


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        ({"model.layers.2.attn.indexer.k_cache": None}, "indexer key cache per ratio-4 layer"),
        ({STATE: None}, "c4 compressor state per ratio-4 layer"),
        ({"extra": {"kind": "full_attention", "block_size": 16, "num_kv_heads": 1,
                    "head_size": 128}}, "got full_attention"),
        ({STATE: {"kind": "sliding_window_mla", "block_size": 4, "head_size": 2048,
                  "dtype": "bfloat16", "sliding_window": 8}}, "float32"),
        ({STATE: {"kind": "sliding_window_mla", "block_size": 4, "head_size": 1000,
                  "dtype": "float32", "sliding_window": 8}}, "head_size"),
        ({"model.layers.3.attn": {"kind": "mla", "block_size": 256, "head_size": 512,
                                  "dtype": "uint8", "state_content_bytes": 584,
                                  "model_version": "deepseek_v4", "compress_ratio": 2}},
         "compression ratios"),
        ({"model.layers.0.attn.swa_cache": {
            "kind": "sliding_window_mla", "block_size": 64, "head_size": 512,
            "dtype": "bfloat16", "sliding_window": 128, "model_version": "deepseek_v4"}},
         "fp8 rows of 584 bytes"),
    ],
)
def test_refuses_caches_sglang_does_not_pair(edit: dict[str, Any | None], match: str) -> None:
    with pytest.raises(UnsupportedRequestError, match=match):
        plan_sglang(_edited(edit))


@settings(max_examples=25, deadline=None)
@given(
    available=st.integers(2_760_000_000, 64 * GIB),
    ratio=st.sampled_from([None, 0.05, 0.1, 0.3, 0.9]),
    requests=st.sampled_from([None, 1, 16, 256]),
    context=st.sampled_from([256, 4096, 65536]),
)
def test_any_budget_plans_soundly(
    available: int, ratio: float | None, requests: int | None, context: int
) -> None:
    """Every plan that comes out passes check_plan, its rings fit their rows, and its pools keep
    SGLang's proportions (c4 = full // 4, c128 = full // 128, window a page multiple)."""
    engine: dict[str, Any] = {"context_length": context}
    if ratio is not None:
        engine["swa_full_tokens_ratio"] = ratio
    if requests is not None:
        engine["max_running_requests"] = requests
    try:
        plan = plan_sglang(v4_request(available, **engine))
    except CapacityError:
        return
    check_plan(plan)
    v4 = plan.deepseek_v4
    assert v4 is not None
    full = plan.max_total_num_tokens
    assert full % 256 == 0
    assert v4.swa_tokens % 256 == 0
    assert (v4.c4_tokens, v4.c128_tokens) == (full // 4, full // 128)
    assert plan.max_running_requests == min(256 if requests is None else requests, full // 2)
    for name in ("v4_state_c4", "v4_index_state_c4", "v4_state_c128"):
        p = pool(plan, name)
        assert p.num_blocks * (p.block_tokens or 0) <= tensor(plan, name).views[0].shape[0]
