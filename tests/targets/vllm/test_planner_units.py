"""The planner's steps one by one: units and packs, hot buffer, pools, capacity, refusals."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest

import hisparse_plan as hp
from hisparse_plan.models import MLASpec
from hisparse_plan.targets.vllm.rules.hot import HotPack, hot_packs
from support.golden import load

BASE = load("bf16_small_with_full_attention")[0]


def _source(pages: list[int], leaders: list[bool]) -> list[tuple[str, MLASpec]]:
    return [
        (f"l{i}", MLASpec(block_size=1, head_size=page, dtype="uint8",
                          is_index_group_leader=leader))
        for i, (page, leader) in enumerate(zip(pages, leaders, strict=True))
    ]


def _names(packs: list[HotPack]) -> list[list[str]]:
    return [pack.names for pack in packs]


def test_units_follow_leaders_and_pack_greedily() -> None:
    source = _source([10] * 6, [True, False, False, True, False, True])
    # units: l0-l2 (30), l3-l4 (20), l5 (10); indexer block 50 holds the first two units
    assert _names(hot_packs(source, 50)) == [["l0", "l1", "l2", "l3", "l4"], ["l5"]]
    assert _names(hot_packs(source, 49)) == [["l0", "l1", "l2"], ["l3", "l4", "l5"]]


def test_shared_specs_pack_like_single_layers() -> None:
    leader = MLASpec(block_size=1, head_size=10, dtype="uint8", is_index_group_leader=True)
    follower = MLASpec(block_size=1, head_size=10, dtype="uint8")
    source = [("a", leader), ("b", leader), ("c", follower), ("d", leader)]
    # units: a (10), b-c (20), d (10)
    assert _names(hot_packs(source, 30)) == [["a", "b", "c"], ["d"]]
    assert [pack.page for pack in hot_packs(source, 30)] == [10, 10]


def test_a_unit_bigger_than_an_indexer_block_gets_its_own_pack() -> None:
    source = _source([10] * 4, [False, False, False, True])
    assert _names(hot_packs(source, 5)) == [["l0", "l1", "l2"], ["l3"]]


def test_a_pack_of_mixed_pages_is_refused_naming_them() -> None:
    source = _source([10, 20], [True, True])
    with pytest.raises(hp.PlanError, match=r"\[10, 20\]"):
        hot_packs(source, 100)


def _request(**changes: Any) -> dict[str, Any]:
    request = copy.deepcopy(BASE)
    for path, value in changes.items():
        section, field = path.split("__")
        request[section][field] = value
    return request


def test_hot_buffer_default_and_warning() -> None:
    plan = hp.plan(_request(hisparse__max_decode_query_len=3, device__num_blocks_override=2000))
    hot = [g.spec for g in plan.groups if isinstance(g.spec, hp.HisparseHotSpec)]
    assert {spec.blocks_per_request for spec in hot} == {math.ceil(4 * 128 / 64)}
    with pytest.warns(hp.PlanWarning, match="not a multiple of block_size 64"):
        plan = hp.plan(_request(hisparse__device_buffer_size=130))
    assert len(plan.warnings) == 1
    assert "62 rows unused" in plan.warnings[0]


def test_hot_buffer_limits() -> None:
    with pytest.raises(hp.PlanError, match="at least 256 rows") as low:
        hp.plan(_request(hisparse__device_buffer_size=255, hisparse__max_decode_query_len=2))
    assert low.value.field == "hisparse.device_buffer_size"
    with pytest.raises(hp.PlanError, match="at most 32768"):
        hp.plan(_request(hisparse__device_buffer_size=32769))
    request = _request()
    request["model"]["index_topk"] = 20000
    with pytest.raises(hp.PlanError, match="the default"):
        hp.plan(request)


def test_topk_buffer_width_overrides_index_topk() -> None:
    request = _request()
    request["layers"]["model.layers.2.self_attn.attn"]["topk_buffer_width"] = 640
    request["device"]["num_blocks_override"] = 2000
    plan = hp.plan(request)
    hot = next(g for g in plan.groups if g.spec.kind == "hisparse_hot")
    assert hot.spec.blocks_per_request == 2 * 640 // 64  # type: ignore[union-attr]


def test_shared_host_pool_rounds_the_block_stride() -> None:
    plan = hp.plan(_request(hisparse__shared_host_pool=True))
    assert plan.host_pool is not None
    assert plan.host_pool.block_stride == 294912  # already a multiple of 4096
    request = _request(hisparse__shared_host_pool=True)
    for layer in request["layers"].values():
        if layer.get("cache_role") == "sparse":
            layer["head_size"] = 575
    plan = hp.plan(request)
    assert plan.host_pool is not None
    page = 4 * 64 * 575 * 2
    assert plan.host_pool.block_stride == math.ceil(page / 4096) * 4096
    assert plan.host_pool.bytes_per_block == page
    assert plan.tensors[0].block_stride == 64 * 575 * 2


def test_host_pool_too_small_names_the_fix() -> None:
    with pytest.raises(hp.CapacityError, match="raise host_pool_gib to") as small:
        hp.plan(_request(hisparse__host_pool_gib=0.01))
    assert small.value.field == "hisparse.host_pool_gib"


def test_device_pool_without_a_block() -> None:
    with pytest.raises(hp.CapacityError, match="no GPU memory left for KV cache blocks") as none:
        hp.plan(_request(device__available_bytes=1000, device__num_blocks_override=None))
    assert none.value.field == "device.available_bytes"


def test_a_pool_that_cannot_admit_one_request_is_refused_with_the_length_that_fits() -> None:
    """SPEC 5.12: 7 blocks against 784 needed (the old golden override)."""
    with pytest.raises(hp.CapacityError) as refused:
        hp.plan(_request(device__num_blocks_override=7))
    message = str(refused.value)
    assert refused.value.field == "device.num_blocks_override"
    assert "784 blocks" in message
    assert "less the null block leave" in message
    # the 4 hot groups alone take 4 blocks each whatever the length: 6 usable blocks hold none
    assert "no max_model_len of 1 token or more fits" in message
    # 299 usable blocks: at L = 3008, 47 indexer + 4 * 47 resident + 4 * 4 hot + 47 full = 298
    # fit; at 3009 it takes 304
    with pytest.raises(hp.CapacityError, match="the estimated max_model_len that fits is 3008"):
        hp.plan(_request(device__num_blocks_override=300))


def test_steady_state_counts_two_resident_pages() -> None:
    plan = hp.plan(_request(device__num_blocks_override=2000))
    admission = 128 + 4 * 128 + 4 * 4 + 128
    steady = 128 + 4 * 2 + 4 * 4 + 128
    host = plan.host_pool.num_blocks / 128  # type: ignore[union-attr]
    assert plan.capacity.max_concurrency == pytest.approx(min(2000 / admission, host))
    expected = min(1 + (2000 - admission) / steady, host)
    assert plan.capacity.steady_state_concurrency == pytest.approx(expected)


def test_sliding_window_groups_need_their_window() -> None:
    request = _request(device__num_blocks_override=5000)
    for name in ("model.extra.0.attn", "model.extra.1.attn", "model.extra.2.attn"):
        request["layers"][name] = {**request["layers"][name], "kind": "sliding_window",
                                   "sliding_window": 1000}
    plan = hp.plan(request)
    window_blocks = math.ceil(min(999 + 8192, 8192) / 64) + 1
    admission = 128 + 4 * 128 + 4 * 4 + window_blocks
    assert plan.capacity.max_concurrency == pytest.approx(5000 / admission)


def test_regular_layers_of_one_kind_share_a_uniform_type_group() -> None:
    request = copy.deepcopy(BASE)
    request["layers"]["model.extra.1.attn"]["head_size"] = 128
    plan = hp.plan(request)
    regular = plan.groups[-1]
    assert regular.spec.kind == "uniform_type"
    assert regular.spec.page_size_bytes == 32768 * 2 + 65536
    assert [t.layers for t in plan.tensors[-2:]] == [
        ["model.extra.0.attn", "model.extra.2.attn"], ["model.extra.1.attn"],
    ]
    hp.check_plan(plan)


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        (lambda r: r["model"].update(index_topk=None), hp.PlanError, "model.index_topk"),
        (lambda r: r["device"].update(pipeline_stages=[
            {"layers": list(r["layers"]), "available_bytes": 2**30}]),
         hp.UnsupportedRequestError, "pipeline_stages"),
        (lambda r: r.setdefault("scheduler", {}).update(disable_hybrid_kv_cache_manager=True),
         hp.UnsupportedRequestError, "disable_hybrid_kv_cache_manager"),
        (lambda r: r["layers"]["model.layers.1.self_attn.attn"].update(alignment=512),
         hp.UnsupportedRequestError, "alignment"),
        (lambda r: r["layers"]["model.layers.1.self_attn.attn"].update(
            model_version="deepseek_v4"), hp.UnsupportedRequestError, "deepseek_v4"),
        (lambda r: r["layers"]["model.layers.2.self_attn.attn"].update(block_size=32),
         hp.PlanError, r"layers\['model.layers.2.self_attn.attn'\].block_size"),
        (lambda r: r["layers"]["model.layers.3.self_attn.attn"].update(
            head_size=500, is_index_group_leader=False), hp.PlanError, "mixes page sizes"),
        (lambda r: r["device"].update(kv_cache_layout="LHBNC"), hp.LayoutError,
         "BLHNC and BLNHC"),
    ],
)
def test_refusals(change: Any, error: type[Exception], match: str) -> None:
    request = copy.deepcopy(BASE)
    change(request)
    with pytest.raises(error, match=match):
        hp.plan(request)


def test_only_regular_layers_is_unsupported_for_now() -> None:
    request = copy.deepcopy(BASE)
    request["layers"] = {n: s for n, s in request["layers"].items() if s["kind"] != "mla"}
    with pytest.raises(hp.UnsupportedRequestError, match="no layer has kind 'mla'"):
        hp.plan(request)


def test_resident_groups_need_a_block_outermost_layout() -> None:
    """With one page size everywhere the layout check passes; resident views still need B first."""
    request = copy.deepcopy(BASE)
    for layer in request["layers"].values():
        if layer["kind"] == "mla":
            layer["head_size"] = 128
    request["layers"] = {n: s for n, s in request["layers"].items() if s["kind"] == "mla"}
    request["device"]["kv_cache_layout"] = "LBNHC"
    with pytest.raises(hp.LayoutError, match="block-outermost"):
        hp.plan(request)
    request["device"]["kv_cache_layout"] = "BHLNC"
    hp.check_plan(hp.plan(request))


def test_misaligned_views_are_refused() -> None:
    """Five 2-byte bf16 indexer pages make 10-byte device blocks: no float32 view fits them."""
    tiny = {"kind": "mla", "block_size": 1, "head_size": 1, "dtype": "bfloat16"}
    layers: dict[str, Any] = {}
    for i in range(5):
        layers[f"s{i}"] = {**tiny, "is_index_group_leader": True}
        layers[f"i{i}"] = {**tiny, "cache_role": "indexer"}
    layers["regular"] = {"kind": "full_attention", "block_size": 1, "num_kv_heads": 1,
                         "head_size": 1, "dtype": "float32"}
    request = {
        "layers": layers,
        "model": {"max_model_len": 16, "index_topk": 2},
        "hisparse": {"host_pool_gib": 1e-6},
        "device": {"available_bytes": 1000},
    }
    with pytest.raises(hp.LayoutError, match=r"layers\['regular'\]: its block stride of 10"):
        hp.plan(request)
    layers["regular"]["dtype"] = "bfloat16"
    hp.check_plan(hp.plan(request))


def test_plan_accepts_a_validated_request_or_a_mapping() -> None:
    assert hp.plan(hp.PlanRequest.model_validate(BASE)) == hp.plan(BASE)
