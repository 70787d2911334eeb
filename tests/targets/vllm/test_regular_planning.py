"""Regular planning (SPEC 7) stage by stage: the worked examples, each strategy, each refusal."""

from __future__ import annotations

import copy
from typing import Any

import pytest

import hisparse_plan as hp
from hisparse_plan.models import FullAttentionSpec, KVCacheLayout, PlanRequest
from hisparse_plan.targets.trace import Trace
from hisparse_plan.targets.vllm import plan_traced
from hisparse_plan.targets.vllm.groups import Layer
from hisparse_plan.targets.vllm.pipeline import request_layers
from hisparse_plan.targets.vllm.regular_groups import regular_groups
from support.golden import load

GIB = 2**30
ATTN = {"kind": "full_attention", "block_size": 16, "num_kv_heads": 8, "head_size": 128}
MLA = {"kind": "mla", "block_size": 16, "head_size": 576}
MAMBA = {"kind": "mamba", "block_size": 16, "state_shapes": [[3, 4096], [8, 64, 64]],
         "state_dtypes": ["bfloat16", "bfloat16"]}
SLIDING = {**ATTN, "kind": "sliding_window", "sliding_window": 128}


def _request(layers: dict[str, Any], layout: str = "BLNHC", **model: Any) -> dict[str, Any]:
    return {
        "layers": layers,
        "model": {"max_model_len": 4096, **model},
        "device": {"available_bytes": 8 * GIB, "kv_cache_layout": layout},
    }


def _groups(request: dict[str, Any]) -> list[list[str]]:
    return [group.layer_names for group in hp.plan(request).groups]


def _layers(request: dict[str, Any]) -> list[Layer]:
    return request_layers(PlanRequest.model_validate(request))


def test_worked_packed_example_of_section_7_10() -> None:
    """Six a/b pairs (full 65,536 B, mla 18,432 B), four Mamba layers, one sliding layer."""
    layers: dict[str, Any] = {}
    for i in range(6):
        layers[f"a{i}"] = ATTN
        layers[f"b{i}"] = MLA
    for i in range(4):
        layers[f"m{i}"] = MAMBA
    layers["s0"] = SLIDING
    plan = hp.plan(_request(layers, "BLHNC"))
    hp.check_plan(plan)
    assert [g.layer_names for g in plan.groups] == [
        [f"{x}{i}" for i in range(6) for x in "ab"], [f"m{i}" for i in range(4)], ["s0"]]
    assert [g.spec.page_size_bytes for g in plan.groups] == [503808, 360448, 65536]
    assert all(g.spec.kind == "uniform_type" for g in plan.groups)
    assert plan.device_pool.bytes_per_block == 503808
    a, b = plan.tensors[0], plan.tensors[1]
    assert (a.offset, a.layer_stride, a.block_stride) == (0, 65536, 503808)
    assert (b.offset, b.layer_stride, b.block_stride) == (6 * 65536, 18432, 503808)


def test_gemma_worked_example_numbers() -> None:
    request, _ = load("regular_gemma3_27b_swa")
    plan = hp.plan(request)
    assert [len(g.layer_names) for g in plan.groups] == [9, 9, 9, 9, 8, 8, 10]
    assert plan.groups[0].layer_names[:3] == [
        f"model.layers.{i}.self_attn.attn" for i in (0, 7, 14)]
    assert (plan.device_pool.bytes_per_block, plan.num_blocks) == (1310720, 32768)
    assert plan.capacity.max_concurrency == pytest.approx(32768 / 11654)
    assert plan.capacity.steady_state_concurrency is None
    assert plan.host_pool is None


def test_uniform_spec_and_uniform_type() -> None:
    one = _request({f"l{i}": ATTN for i in range(4)})
    plan = hp.plan(one)
    assert [g.spec.kind for g in plan.groups] == ["full_attention"]
    family = _request({"l0": ATTN, "l1": {**ATTN, "head_size": 64}, "l2": MLA})
    plan = hp.plan(family)
    assert [g.spec.kind for g in plan.groups] == ["uniform_type"]
    assert plan.groups[0].spec.page_size_bytes == 65536 + 32768 + 18432


def test_unified_pages_scale_block_sizes() -> None:
    """Outside block-outermost layouts a smaller page whose size divides the largest is scaled."""
    groups = regular_groups(
        _layers(_request({"s0": SLIDING, "s1": SLIDING, "f0": {**ATTN, "head_size": 64}},
                         "LBNHC")),
        KVCacheLayout.LBNHC, Trace(),
    )
    full = groups[-1].group.spec
    assert (full.kind, full.block_size, full.page_size_bytes) == ("full_attention", 32, 65536)


def test_unified_pages_pad_what_does_not_divide() -> None:
    plan = hp.plan(_request({"s0": SLIDING, "f0": {**ATTN, "head_size": 100}}, "LBNHC"))
    hp.check_plan(plan)
    padded = plan.groups[1].spec
    assert isinstance(padded, FullAttentionSpec)
    assert (padded.page_size_bytes, padded.page_size_padded) == (65536, 65536)
    assert plan.tensors[1].block_stride == 65536  # padded page, not the natural 51,200


def test_full_allocation_fallback_promotes_sliding_layers() -> None:
    """MLA's page does not divide the sliding page: sliding layers take full blocks (7.3.3)."""
    request = _request({"m0": MLA, "s0": SLIDING, "f0": ATTN}, "LBNHC")
    plan = hp.plan(request)
    hp.check_plan(plan)
    assert _groups(request) == [["m0", "s0", "f0"]]
    members = plan.groups[0].spec.specs  # type: ignore[union-attr]
    promoted = members["s0"]
    assert isinstance(promoted, FullAttentionSpec)
    assert promoted.sliding_window == 128
    assert len(plan.tensors) == 3  # the promoted layer is its own spec, its own tensor
    blocks_per_request = 4096 // 16
    assert plan.capacity.max_concurrency == pytest.approx(plan.num_blocks / blocks_per_request)


def test_refused_mla_beside_mamba_names_the_layer() -> None:
    request, _ = load("regular_reject_mla_beside_mamba")
    with pytest.raises(hp.PlanError, match=r"layers\['.*'\]: pages cannot be unified") as no:
        hp.plan(request)
    assert no.value.field is not None
    assert no.value.field.startswith("layers[")


@pytest.mark.parametrize(
    ("layers", "layout", "match"),
    [
        ({"x": {**MLA, "kind": "sliding_window_mla", "sliding_window": 64,
                "compress_ratio": 128}}, "BLNHC", "stores no state at compress_ratio 128"),
        ({"m": {**MAMBA, "page_size_padded": 100}}, "BLNHC", "page_size_padded: expected at least"),
        ({"x": {**MLA, "kind": "sliding_window_mla", "sliding_window": 64},
          "y": {**MLA, "kind": "sliding_window_mla", "sliding_window": 64, "head_size": 512}},
         "BLNHC", "must be identical"),
        ({"s0": {**SLIDING, "page_size_padded": 2 * 65536}, "f": {**ATTN, "num_kv_heads": 2}},
         "LHBNC", "outside the page"),
    ],
)
def test_refusals_name_the_layer(layers: dict[str, Any], layout: str, match: str) -> None:
    with pytest.raises(hp.PlanError, match=match) as refused:
        hp.plan(_request(layers, layout))
    assert "layers[" in str(refused.value)


def test_different_block_strides_in_one_overlaid_pool_are_refused() -> None:
    """vLLM 0.33 would let block b of one group overlap another block id of another group."""
    layers = {"f": {**ATTN, "num_kv_heads": 1, "head_size": 1},
              "s": {**SLIDING, "num_kv_heads": 2, "head_size": 1, "sliding_window": 1,
                    "block_stride_alignment": 256}}
    with pytest.raises(hp.LayoutError, match="expected one block stride"):
        hp.plan(_request(layers, "LBNHC"))


def _staged(stages: list[tuple[list[str], int]], **model: Any) -> dict[str, Any]:
    request = _request({f"l{i}": ATTN for i in range(4)}, **model)
    request["device"]["pipeline_stages"] = [
        {"layers": names, "available_bytes": size} for names, size in stages]
    return request


def test_pipeline_stages_place_each_stage_in_its_pool() -> None:
    plan = hp.plan(_staged([(["l0", "l1"], GIB), (["l2", "l3"], 2 * GIB)]))
    hp.check_plan(plan)
    assert len(plan.device_pools) == 2
    assert [pool.layers for pool in plan.device_pools] == [["l0", "l1"], ["l2", "l3"]]
    assert plan.num_blocks == GIB // (2 * 65536)  # stage 0 limits
    assert [t.layers for t in plan.tensors] == [["l0", "l1"], ["l2", "l3"]]
    with pytest.raises(hp.PlanError, match="pipeline stages"):
        _ = plan.device_pool


@pytest.mark.parametrize(
    ("stages", "match"),
    [
        ([(["l0", "l1"], GIB), (["l2"], GIB)], "'l3' is in no stage"),
        ([(["l0", "l1", "x"], GIB), (["l2", "l3"], GIB)], "'x' is not a layer"),
        ([(["l0", "l1"], GIB), (["l1", "l2", "l3"], GIB)], "also in stage 0"),
    ],
)
def test_bad_stages_are_refused(stages: list[tuple[list[str], int]], match: str) -> None:
    with pytest.raises(hp.PlanError, match=match):
        hp.plan(_staged(stages))


def test_a_stage_without_a_layer_of_a_group_keeps_it_empty() -> None:
    """As vLLM 0.34 plans it: stage 0 holds no layer of the sliding-window group, so it places
    no tensor for it, yet the group's blocks still count in admission on every stage."""
    request = _request({"l0": ATTN, "l1": {**ATTN, "head_size": 64}})
    request["device"]["pipeline_stages"] = [
        {"layers": ["l0"], "available_bytes": GIB}, {"layers": ["l1"], "available_bytes": GIB}]
    hp.check_plan(hp.plan(request))
    request["layers"]["l1"] = {**ATTN, "head_size": 64, "kind": "sliding_window",
                               "sliding_window": 64}
    request["layers"]["l2"] = {**ATTN, "head_size": 64}
    request["device"]["pipeline_stages"][1]["layers"] = ["l1", "l2"]
    plan = hp.plan(request)
    hp.check_plan(plan, request=request)
    # packed (mixed pages): l0 and l2 one full family (pages 65536, 32768), l1 its own group
    assert [(g.spec.kind, g.layer_names) for g in plan.groups] == [
        ("uniform_type", ["l0", "l2"]), ("uniform_type", ["l1"])]
    assert [t.layers for t in plan.tensors] == [["l0"], ["l2"], ["l1"]]
    assert [pool.bytes_per_block for pool in plan.device_pools] == [65536, 32768]
    assert plan.num_blocks == GIB // 65536
    # every group counts on every stage: 256 full blocks + ceil(min(63 + 8192, 4096) / 16) + 1
    assert plan.capacity.max_concurrency == plan.num_blocks / (256 + 257)


def test_auto_fit_shortens_to_the_longest_length_that_fits() -> None:
    request, expected = load("regular_llama3_70b_pp4_autofit")
    plan = hp.plan(request)
    assert plan.fitted_max_model_len == expected["fitted_max_model_len"] == 117936
    assert plan.max_model_len == 117936
    one_more = copy.deepcopy(request)
    one_more["model"]["auto_fit_max_model_len"] = False
    with pytest.raises(hp.CapacityError, match=r"estimated max_model_len that fits is 117936"):
        hp.plan(one_more)
    none = _request({"l0": ATTN}, auto_fit_max_model_len=True)
    none["device"]["available_bytes"] = 65536  # the null block and nothing more
    with pytest.raises(hp.CapacityError, match="cannot serve a single token"):
        hp.plan(none)
    fits = _request({"l0": ATTN}, auto_fit_max_model_len=True)
    assert hp.plan(fits).fitted_max_model_len == 4096  # never lengthened


def test_required_blocks_by_kind() -> None:
    """7.7: window, chunk and Mamba states, with the drafter's extra tokens on windows."""
    layers = {
        "s": SLIDING,
        "c": {**ATTN, "kind": "chunked_local_attention", "attention_chunk_size": 256},
        "m": {**MAMBA, "num_speculative_blocks": 2},
    }
    request = _request(layers, "LBNHC")
    request["scheduler"] = {"max_num_batched_tokens": 64, "num_prefill_lookahead_tokens": 3}
    traced = plan_traced(request)
    required = {d.subject: d.value for d in traced.trace.decisions if d.stage == "admit"}
    plan = traced.plan
    kinds = [g.spec.kind for g in plan.groups]
    by_kind = dict(zip(kinds, (required[f"required blocks of device group {i}"]
                               for i in range(len(kinds))), strict=True))
    block = {k: g.spec.block_size for k, g in zip(kinds, plan.groups, strict=True)}
    assert by_kind["sliding_window"] == -(-(128 - 1 + 2 + 64) // block["sliding_window"]) + 1
    assert by_kind["chunked_local_attention"] == -(
        -(256 + 64) // block["chunked_local_attention"])
    assert by_kind["mamba"] == 3


def test_a_stage_buckets_its_members_in_their_own_order() -> None:
    """Stage 1 holds c (spec Y) before d (spec X): its tensors follow that order, not the
    group's (X first), as vLLM's projection does (found by the vLLM differential harness)."""
    narrow = {**ATTN, "head_size": 64}
    request = _request({"a": ATTN, "b": narrow, "c": narrow, "d": ATTN})
    request["device"]["pipeline_stages"] = [
        {"layers": ["a", "b"], "available_bytes": GIB},
        {"layers": ["c", "d"], "available_bytes": GIB},
    ]
    plan = hp.plan(request)
    hp.check_plan(plan)
    assert [t.layers for t in plan.tensors] == [["a"], ["b"], ["c"], ["d"]]
    assert [t.offset for t in plan.tensors] == [0, 65536, 0, 32768]
