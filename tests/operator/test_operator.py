"""Operator logic: the baseline, pool bounds, sweeps, tuning and explanations."""

from __future__ import annotations

import dataclasses
import math
import warnings
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter

import hisparse_plan as hp
from hisparse_plan.models import KVCacheLayout
from hisparse_plan.operator import (
    BestTune,
    CapacityComparison,
    Explanation,
    HostPoolTune,
    Sweep,
    TuneResult,
    all_gpu_request,
    baseline_capacity,
    baseline_plan,
    best_concurrency,
    compare,
    default_points,
    explain,
    json_schemas,
    pool_bounds,
    smallest_host_pool,
    sweep,
)
from hisparse_plan.presets import Settings, architecture_from_config, build_request, load_preset
from hisparse_plan.presets import override_request as override
from support.golden import CASES, load, project
from support.planning_support import plan_or_none
from support.strategies import hisparse_requests

GIB = 2**30
PLANNED_CASES = [case for case in CASES if not load(case)[1].get("error")]
# DeepSeek-V3.2's geometry on 4 layers: the same arithmetic, a hundred times cheaper to plan.
SMALL = architecture_from_config(
    {"num_hidden_layers": 4, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
     "index_head_dim": 128, "index_topk": 2048, "max_position_embeddings": 32768},
    origin="test",
)
SMALL_REQUEST = build_request(SMALL, Settings(gpu_mem_bytes=GIB, host_pool_bytes=GIB))


def _golden(case: str) -> hp.PlanRequest:
    return hp.PlanRequest.model_validate(load(case)[0])


_quiet_plan = plan_or_none


# -- baseline and comparison ----------------------------------------------------------------------


def test_capacity_against_the_baseline_by_hand() -> None:
    """`capacity deepseek-v3.2 --gpu-mem 60GiB --host-pool 64GiB --max-model-len 163840`."""
    result = compare(build_request(load_preset("deepseek-v3.2").architecture))
    source_page, indexer_page = 61 * 64 * 656, 61 * 64 * 132
    assert (source_page, indexer_page) == (2561024, 515328)
    baseline_blocks = 64424509440 // (source_page + indexer_page)
    assert baseline_blocks == 20941
    assert result.baseline.num_blocks == baseline_blocks
    assert result.baseline.blocks_per_request == 163840 // 64 == 2560
    assert result.baseline.max_concurrency == 20941 / 2560 == 8.180078125
    # HiSparse is host-bound here: 64 GiB // 61 source pages = 26832 blocks, 2560 a request.
    assert result.hisparse.max_concurrency == 26832 / 2560 == 10.48125
    assert result.hisparse.steady_state_concurrency == 10.48125
    assert result.ratio == pytest.approx(10.48125 / 8.180078125)
    assert result.binding == "host"
    assert CapacityComparison.model_validate_json(result.model_dump_json()) == result


def test_baseline_is_the_golden_regular_plan() -> None:
    """The baseline is planned: DeepSeek-V3.2 without HiSparse is the golden regular case."""
    request = build_request(load_preset("deepseek-v3.2").architecture,
                            Settings(layout=KVCacheLayout.LBNHC))
    golden_request, expected = load("regular_deepseek_v32_no_hisparse_lbnhc")
    assert all_gpu_request(request) == hp.PlanRequest.model_validate(golden_request)
    assert project(baseline_plan(request).model_dump(mode="json")) == expected
    baseline = baseline_capacity(request)
    assert (baseline.num_blocks, baseline.bytes_per_block) == (20941, 3076352)
    assert round(baseline.max_concurrency, 6) == 8.180078


def test_baseline_counts_regular_layers() -> None:
    request = _golden("bf16_small_with_full_attention")
    result = compare(request)
    regular = hp.plan(all_gpu_request(request))
    assert regular.host_pool is None
    assert result.baseline.num_blocks == regular.num_blocks
    assert result.baseline.bytes_per_block == regular.device_pool.bytes_per_block
    assert result.baseline.max_concurrency == regular.capacity.max_concurrency
    # Every layer, the full-attention one too, has its pages on the GPU in the baseline.
    placed = {name for group in regular.groups for name in group.layer_names}
    assert placed == set(request.layers)


def test_ratio_is_none_when_the_baseline_holds_nothing() -> None:
    # Room for HiSparse's smaller device blocks, not for one request's all-GPU blocks.
    request = override(SMALL_REQUEST, Settings(gpu_mem_bytes=64 * 2**20))
    result = compare(request)
    assert result.hisparse.max_concurrency > 0
    assert result.baseline.max_concurrency == 0
    assert result.baseline.num_blocks is None
    assert result.baseline.refusal is not None
    assert result.ratio is None
    assert CapacityComparison.model_validate_json(result.model_dump_json()) == result


# -- pool bounds -------------------------------------------------------------------------------


@settings(max_examples=60)
@given(hisparse_requests(max_layers=40, refusals=False))
def test_bounds_rebuild_the_plans_capacity(request: dict[str, Any]) -> None:
    plan = _quiet_plan(request)
    if plan is None:
        return
    bounds = pool_bounds(plan)
    host = bounds.host_bound
    assert float(min(bounds.device_bound("max"), host)) == pytest.approx(
        plan.capacity.max_concurrency, rel=1e-12)
    steady = plan.capacity.steady_state_concurrency
    assert steady is not None
    assert float(min(bounds.device_bound("steady"), host)) == pytest.approx(steady, rel=1e-12)
    binding = bounds.binding("max")
    assert (binding == "host") == (host < bounds.device_bound("max"))
    # device_blocks_for inverts device_bound: the fewest blocks reaching the bound it reports.
    for metric in ("max", "steady"):
        target = bounds.device_bound(metric)
        if target > 0:
            assert bounds.device_blocks_for(target, metric) <= bounds.num_blocks


@given(target=st.fractions(min_value=Fraction(1, 100), max_value=200), metric=st.sampled_from(
    ["max", "steady"]))
def test_device_blocks_for_is_the_least(target: Fraction, metric: Any) -> None:
    bounds = pool_bounds(hp.plan(SMALL_REQUEST))
    blocks = bounds.device_blocks_for(target, metric)

    def reach(n: int) -> Fraction:
        return dataclasses.replace(bounds, num_blocks=n).device_bound(metric)

    assert reach(blocks) >= target
    assert blocks == 0 or reach(blocks - 1) < target


# -- sweeps -----------------------------------------------------------------------------------


def test_default_points() -> None:
    request = build_request(load_preset("deepseek-v3.2").architecture)
    assert default_points("max-model-len", request) == [
        4096, 8192, 16384, 32768, 65536, 131072, 163840]
    assert default_points("max-model-len", request, 8192) == [4096, 8192]
    assert default_points("host-pool", request)[0] == 16 * GIB
    assert default_points("host-pool", request)[-1] == 1024 * GIB


def test_sweep_keeps_refused_points() -> None:
    result = sweep(SMALL_REQUEST, "host-pool", [1024, GIB, 2 * GIB])
    assert [p.value for p in result.points] == [1024, GIB, 2 * GIB]
    refused, small, large = result.points
    assert refused.comparison is None
    assert refused.error
    assert "host_pool_gib" in refused.error
    assert small.comparison is not None
    assert large.comparison is not None
    assert large.comparison.hisparse.max_concurrency >= small.comparison.hisparse.max_concurrency
    assert Sweep.model_validate_json(result.model_dump_json()) == result


def test_context_sweep_moves_only_the_context() -> None:
    result = sweep(SMALL_REQUEST, "max-model-len", [4096, 32768])
    short, long = (p.comparison for p in result.points)
    assert short is not None
    assert long is not None
    assert (short.max_model_len, long.max_model_len) == (4096, 32768)
    assert short.baseline.num_blocks == long.baseline.num_blocks
    assert short.baseline.max_concurrency == 8 * long.baseline.max_concurrency


# -- tune: re-planned at the answer and one step below ----------------------------------------


def _metric(request: hp.PlanRequest, host_bytes: int, metric: str) -> float | None:
    plan = _quiet_plan(override(request, Settings(host_pool_bytes=host_bytes)))
    if plan is None:
        return None
    capacity = plan.capacity
    if metric == "steady" and capacity.steady_state_concurrency is not None:
        return capacity.steady_state_concurrency
    return capacity.max_concurrency


@settings(max_examples=25)
@given(
    target=st.one_of(
        st.integers(1, 30).map(float),
        st.fractions(min_value=Fraction(1, 10), max_value=30, max_denominator=1000).map(float),
    ),
    metric=st.sampled_from(["max", "steady"]),
    spec_tokens=st.integers(0, 2),
)
def test_smallest_host_pool_is_minimal(target: float, metric: Any, spec_tokens: int) -> None:
    request = override(SMALL_REQUEST, Settings(spec_tokens=spec_tokens))
    gpu = pool_bounds(hp.plan(request)).device_bound(metric)
    if gpu < Fraction(target):
        with pytest.raises(hp.CapacityError, match="the GPU binds"):
            smallest_host_pool(request, target, metric)
        return
    answer = smallest_host_pool(request, target, metric)
    at = _metric(request, answer.host_pool_bytes, metric)
    assert at is not None
    assert at >= target
    assert answer.host_pool_bytes == answer.host_blocks * answer.step_bytes
    assert int(answer.host_pool_gib * GIB) == answer.host_pool_bytes
    for below in (answer.host_pool_bytes - 1, answer.host_pool_bytes - answer.step_bytes):
        missed = _metric(request, below, metric)
        assert missed is None or missed < target
    assert answer.below == _metric(request, answer.host_pool_bytes - answer.step_bytes, metric)


def test_smallest_host_pool_for_deepseek() -> None:
    request = build_request(load_preset("deepseek-v3.2").architecture)
    answer = smallest_host_pool(request, 20)
    # 20 requests of 2560 host blocks each, 61 * 41984 bytes a block.
    assert answer.host_blocks == 20 * 2560
    assert answer.host_pool_bytes == 20 * 2560 * 2561024
    assert answer.capacity.max_concurrency == 20.0
    assert answer.binding == "host"
    assert answer.below == (20 * 2560 - 1) / 2560
    assert TypeAdapter(TuneResult).validate_json(answer.model_dump_json()) == answer


def test_unreachable_target_says_how_much_gpu_memory() -> None:
    request = build_request(load_preset("deepseek-v3.2").architecture)
    with pytest.raises(hp.CapacityError, match="the GPU binds") as refused:
        smallest_host_pool(request, 40)
    # 40 requests * 3712 device blocks each * 545792 bytes a block.
    assert f"{40 * 3712 * 545792} bytes" in str(refused.value)
    assert refused.value.field == "device.available_bytes"


@pytest.mark.parametrize("target", [0.0, -1.0, math.inf, math.nan])
def test_bad_targets(target: float) -> None:
    with pytest.raises(hp.PlanError, match="target"):
        smallest_host_pool(SMALL_REQUEST, target)


@settings(max_examples=20)
@given(dram=st.integers(2**20, 64 * GIB), metric=st.sampled_from(["max", "steady"]))
def test_best_concurrency_and_the_least_pool_for_it(dram: int, metric: Any) -> None:
    try:
        best = best_concurrency(SMALL_REQUEST, dram, metric)
    except hp.CapacityError:
        assert _metric(SMALL_REQUEST, dram, metric) is None  # DRAM too small for one request
        return
    full = _metric(SMALL_REQUEST, dram, metric)
    assert full is not None
    assert _metric(SMALL_REQUEST, best.host_pool_bytes, metric) == full
    fewer = _metric(SMALL_REQUEST, best.host_pool_bytes - best.step_bytes, metric)
    assert fewer is None or fewer < full
    assert best.spare_dram_bytes == dram - best.host_pool_bytes >= 0
    if best.binding == "host":
        assert best.spare_dram_bytes < best.step_bytes
    assert isinstance(TypeAdapter(TuneResult).validate_python(best.model_dump()), BestTune)


def test_best_concurrency_for_deepseek_on_a_big_node() -> None:
    request = build_request(load_preset("deepseek-v3.2").architecture)
    best = best_concurrency(request, 512 * GIB)
    assert best.binding == "device"
    assert best.capacity.max_concurrency == 118038 / 3712
    # The host pool needs ceil(118038 / 3712 * 2560) blocks to keep up with the GPU.
    assert best.host_blocks == math.ceil(Fraction(118038, 3712) * 2560)


# -- explain ----------------------------------------------------------------------------------


def _plan_numbers(plan: hp.KVCachePlan) -> dict[str, float]:
    numbers: dict[str, float] = {
        "num_blocks": plan.num_blocks,
        "capacity.max_concurrency": plan.capacity.max_concurrency,
    }
    host = plan.host_pool
    if host is not None:
        numbers |= {
            "host_pool.budget_bytes": host.budget_bytes,
            "host_pool.block_stride": host.block_stride,
            "host_pool.num_blocks": host.num_blocks,
            "host_pool.bytes_per_block": host.bytes_per_block,
            "host_pool.size": host.size,
        }
    for stage, pool in enumerate(plan.device_pools):
        numbers[f"device_pools[{stage}].bytes_per_block"] = pool.bytes_per_block
        numbers[f"device_pools[{stage}].size"] = pool.size
    if plan.capacity.steady_state_concurrency is not None:
        numbers["capacity.steady_state_concurrency"] = plan.capacity.steady_state_concurrency
    if plan.fitted_max_model_len is not None:
        numbers["fitted_max_model_len"] = plan.fitted_max_model_len
    for index, tensor in enumerate(plan.tensors):
        for field in ("layer_stride", "block_stride", "offset"):
            numbers[f"tensors[{index}].{field}"] = getattr(tensor, field)
    return numbers


def _check_explained(request: hp.PlanRequest, explanation: Explanation) -> None:
    """The explanation is the planner's own record: it names every number the plan holds."""
    plan = _quiet_plan(request)
    assert plan is not None
    for name, value in _plan_numbers(plan).items():
        assert explanation.step(name).value == pytest.approx(value, rel=1e-12), name
    for group in range(len(plan.groups)):
        assert explanation.step(f"groups[{group}]").value == plan.groups[group].spec.kind
    assert all(step.formula for section in explanation.sections for step in section.steps)


@pytest.mark.parametrize("case", PLANNED_CASES)
def test_explain_covers_every_number_of_the_golden_plans(case: str) -> None:
    request = _golden(case)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", hp.PlanWarning)
        explanation = explain(request)
    _check_explained(request, explanation)
    assert Explanation.model_validate_json(explanation.model_dump_json()) == explanation


@settings(max_examples=40)
@given(hisparse_requests(max_layers=24, refusals=False))
def test_explain_covers_every_number_of_any_plan(raw: dict[str, Any]) -> None:
    request = hp.PlanRequest.model_validate(raw)
    if _quiet_plan(request) is None:
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", hp.PlanWarning)
        _check_explained(request, explain(request))


def test_explain_starts_from_the_config_fields() -> None:
    arch = load_preset("glm-5-index-share-4").sparse_architecture
    assert arch is not None
    request = build_request(arch, Settings(max_model_len=131072))
    explanation = explain(request, architecture=arch, kv_dtype="fp8_ds_mla")
    assert explanation.sections[0].title.startswith("model config")
    row = explanation.step("sparse row bytes (fp8_ds_mla)")
    assert row.value == 656
    assert row.inputs == {"kv_lora_rank": 512, "qk_rope_head_dim": 64}
    assert explanation.step("indexer row bytes (fp8)").value == 132
    assert explanation.step("indexer layers").value == 20
    assert explanation.step("indexer layers").inputs["index_topk_freq"] == 4
    assert explanation.step("max_model_len").formula.startswith("chosen")
    bf16 = explain(build_request(arch, Settings(kv_dtype="bfloat16")), architecture=arch,
                   kv_dtype="bfloat16")
    assert bf16.step("sparse row bytes (bfloat16)").value == 1152
    assert bf16.step("max_model_len").formula == "max_position_embeddings"


def test_schemas_describe_the_contracts() -> None:
    schemas = json_schemas()
    assert set(schemas) == {"request", "plan", "sglang-plan"}
    assert {"layers", "model", "hisparse", "device", "scheduler"} <= set(
        schemas["request"]["properties"])
    assert {"num_blocks", "groups", "tensors", "host_pool", "capacity", "pools"} <= set(
        schemas["plan"]["properties"])
    assert {"pools", "tensors", "max_total_num_tokens", "req_to_token"} <= set(
        schemas["sglang-plan"]["properties"])


def test_tune_results_are_tagged() -> None:
    answer = smallest_host_pool(SMALL_REQUEST, 2)
    assert isinstance(answer, HostPoolTune)
    assert answer.mode == "host-pool"


def test_an_unreachable_target_is_refused_without_overflow() -> None:
    request = build_request(load_preset("deepseek-v3.2").architecture, Settings())
    with pytest.raises(hp.CapacityError, match="no GPU can"):
        smallest_host_pool(request, 1e308)
