"""check_plan proves sound plans sound and refuses broken ones, naming the first violation."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

import hisparse_plan as hp
from hisparse_plan.views import plan_views
from support.golden import load
from support.oracle import total_bytes, violations
from support.planning_support import plan_or_none
from support.strategies import hisparse_requests, regular_requests

Tamper = Callable[[dict[str, Any]], None]


def _golden_plan(case: str) -> dict[str, Any]:
    request, _ = load(case)
    return hp.plan(request).model_dump(mode="json")


def _check(plan: dict[str, Any]) -> None:
    hp.check_plan(hp.KVCachePlan.model_validate(plan))


def _tensor_of(plan: dict[str, Any], suffix: str) -> int:
    return next(i for i, t in enumerate(plan["tensors"]) if t["layers"][0].endswith(suffix))


def _shift_by_a_block(plan: dict[str, Any]) -> None:
    index = _tensor_of(plan, ".hisparse_hot")
    plan["tensors"][index]["offset"] += plan["device_pools"][0]["bytes_per_block"]


def _stride_a_page_short(plan: dict[str, Any]) -> None:
    index = _tensor_of(plan, ".hisparse_resident")
    page = plan["groups"][2]["spec"]["page_size_bytes"]
    plan["tensors"][index]["block_stride"] -= page


def _layer_listed_twice(plan: dict[str, Any]) -> None:
    index = _tensor_of(plan, ".hisparse_resident")
    plan["tensors"][index]["layers"].append(plan["tensors"][index]["layers"][0])


def _device_pool_one_block_short(plan: dict[str, Any]) -> None:
    per_block = plan["device_pools"][0]["bytes_per_block"]
    for tensor in plan["tensors"]:
        if not tensor["host_resident"]:
            tensor["size"] -= per_block
    plan["device_pools"][0]["size"] -= per_block


def _host_layer_shifted_one_byte(plan: dict[str, Any]) -> None:
    plan["tensors"][0]["offset"] += 1


def _layers_overlap_by_a_byte(plan: dict[str, Any]) -> None:
    index = _tensor_of(plan, ".hisparse_resident")
    plan["tensors"][index]["layer_stride"] -= 1


def _capacity_inflated(plan: dict[str, Any]) -> None:
    plan["capacity"]["max_concurrency"] *= 2


def _group_lists_a_layer_twice(plan: dict[str, Any]) -> None:
    plan["groups"][3]["layer_names"].append(plan["groups"][2]["layer_names"][0])


def _layer_left_unplaced(plan: dict[str, Any]) -> None:
    index = _tensor_of(plan, ".hisparse_hot")
    plan["tensors"][index]["layers"].pop()


def _source_in_device_pool(plan: dict[str, Any]) -> None:
    plan["tensors"][0]["host_resident"] = False


@pytest.mark.parametrize(
    ("tamper", "expect"),
    [
        (_shift_by_a_block, r"block \d+ ends at byte \d+, past the device pool"),
        (_stride_a_page_short, "different block ids"),
        (_layer_listed_twice, "placed by tensors"),
        (_device_pool_one_block_short, "device pool's size"),
        (_host_layer_shifted_one_byte, "of the host pool|past the host pool"),
        (_layers_overlap_by_a_byte, "two layers of one group"),
        (_capacity_inflated, "capacity.max_concurrency"),
        (_group_lists_a_layer_twice, "listed by groups"),
        (_layer_left_unplaced, "is in no tensor"),
        (_source_in_device_pool, "device pool"),
    ],
)
@pytest.mark.parametrize("case", ["deepseek_v32_fp8", "index_share_every_4", "glm5_fp8_blhnc"])
def test_tampered_plans_are_refused(tamper: Tamper, expect: str, case: str) -> None:
    plan = _golden_plan(case)
    _check(plan)  # the untouched plan is sound
    tamper(plan)
    with pytest.raises(hp.PlanInvariantError, match=expect):
        _check(plan)


def test_first_violation_names_tensor_layer_and_block() -> None:
    plan = _golden_plan("deepseek_v32_fp8")
    index = _tensor_of(plan, ".hisparse_resident")
    plan["tensors"][index]["block_stride"] -= plan["groups"][2]["spec"]["page_size_bytes"]
    with pytest.raises(hp.PlanInvariantError) as refused:
        _check(plan)
    error = refused.value
    assert error.tensor == index
    assert error.layer is not None
    assert error.layer.endswith(".hisparse_resident")
    assert error.block is not None
    # The reported byte really lies in the reported page.
    view = plan_views(hp.KVCachePlan.model_validate(plan))[error.layer]
    start = view.offset + error.block * view.block_stride
    byte = int(str(error).split("share byte ")[1].split()[0])
    assert start <= byte < start + view.page_size_bytes


def test_host_shift_inside_a_multi_bucket_host_pool() -> None:
    """Bucket 2 of the index-sharing source moved one byte back onto bucket 1."""
    plan = _golden_plan("index_share_every_4")
    plan["tensors"][1]["offset"] -= 1
    with pytest.raises(hp.PlanInvariantError, match="two layers of one group"):
        _check(plan)


def test_cost_does_not_depend_on_num_blocks() -> None:
    """A billion-block pool is proved by the same arithmetic as a small one."""
    request, _ = load("deepseek_v32_fp8")
    request["device"]["num_blocks_override"] = 10**9
    hp.check_plan(hp.plan(request))


def _small_plan(request: dict[str, Any]) -> hp.KVCachePlan | None:
    plan = plan_or_none(request)
    return plan if plan is not None and total_bytes(plan) <= 3_000_000 else None


@settings(max_examples=60, suppress_health_check=[HealthCheck.filter_too_much])
@given(hisparse_requests(max_layers=6, small=True, refusals=False))
def test_checker_agrees_with_enumeration_on_sound_plans(request: dict[str, Any]) -> None:
    plan = _small_plan(request)
    assume(plan is not None)
    assert plan is not None
    assert violations(plan) == []
    hp.check_plan(plan)


@settings(max_examples=150, suppress_health_check=[HealthCheck.filter_too_much])
@given(
    hisparse_requests(max_layers=6, small=True, refusals=False),
    st.sampled_from(["offset", "layer_stride", "block_stride"]),
    st.integers(min_value=-3, max_value=3),
    st.sampled_from(["byte", "element", "page", "block"]),
    st.data(),
)
def test_checker_agrees_with_enumeration_on_tampered_plans(
    request: dict[str, Any], field: str, steps: int, unit: str, data: st.DataObject
) -> None:
    plan = _small_plan(request)
    assume(plan is not None and steps != 0)
    assert plan is not None
    dumped = copy.deepcopy(plan.model_dump(mode="json"))
    index = data.draw(st.integers(0, len(dumped["tensors"]) - 1))
    tensor = dumped["tensors"][index]
    view = plan_views(plan)[tensor["layers"][0]]
    size = {"byte": 1, "element": view.itemsize, "page": view.page_size_bytes,
            "block": view.block_stride}[unit]
    tensor[field] += steps * size
    assume(tensor[field] >= 0)
    tampered = hp.KVCachePlan.model_validate(dumped)
    truth = violations(tampered)
    try:
        hp.check_plan(tampered)
        verdict: list[str] = []
    except hp.PlanInvariantError as error:
        verdict = [str(error)]
    assert bool(verdict) == bool(truth), (verdict, truth)


@settings(max_examples=80, suppress_health_check=[HealthCheck.filter_too_much])
@given(regular_requests(max_layers=5, small=True))
def test_checker_agrees_with_enumeration_on_sound_regular_plans(request: dict[str, Any]) -> None:
    plan = _small_plan(request)
    assume(plan is not None)
    assert plan is not None
    assert violations(plan) == []
    hp.check_plan(plan)


def _stage_bytes_per_block_raised(plan: dict[str, Any]) -> None:
    pool = plan["device_pools"][1]
    pool["bytes_per_block"] += 65536
    pool["size"] = pool["bytes_per_block"] * plan["num_blocks"]
    for tensor in plan["tensors"][1:2]:
        tensor["size"] = pool["size"]


def _layer_moved_to_another_stage(plan: dict[str, Any]) -> None:
    moved = plan["tensors"][0]["layers"].pop()
    plan["tensors"][1]["layers"].insert(0, moved)


def _fitted_length_shortened(plan: dict[str, Any]) -> None:
    plan["fitted_max_model_len"] -= 16
    plan["capacity"]["max_concurrency"] = plan["num_blocks"] / (
        plan["fitted_max_model_len"] // 16)


def _more_blocks_than_admission_allows(plan: dict[str, Any]) -> None:
    plan["num_blocks"] += 1
    for pool in plan["device_pools"]:
        pool["num_blocks_override"] = plan["num_blocks"]
        pool["size"] = pool["bytes_per_block"] * plan["num_blocks"]
    for tensor in plan["tensors"]:
        tensor["size"] = plan["device_pools"][0]["size"]


@pytest.mark.parametrize(
    ("tamper", "expect"),
    [
        (_stage_bytes_per_block_raised, r"device_pools\[1\].bytes_per_block"),
        (_layer_moved_to_another_stage, "one stage's layers per tensor"),
        (_fitted_length_shortened, "fitted_max_model_len"),
        (_more_blocks_than_admission_allows, "fitted_max_model_len|cannot fit"),
    ],
)
def test_tampered_pipeline_plans_are_refused(tamper: Tamper, expect: str) -> None:
    plan = _golden_plan("regular_llama3_70b_pp4_autofit")
    _check(plan)
    tamper(plan)
    with pytest.raises(hp.PlanInvariantError, match=expect):
        _check(plan)


# -- meaning: tampers that keep every byte sound ----------------------------------------------


def _groups_of(plan: dict[str, Any], kind: str) -> list[int]:
    return [i for i, g in enumerate(plan["groups"]) if g["spec"]["kind"] == kind]


def _resident_block_size(plan: dict[str, Any]) -> None:
    plan["groups"][_groups_of(plan, "hisparse_resident")[0]]["spec"]["block_size"] = 8192


def _hot_blocks_per_request(plan: dict[str, Any]) -> None:
    plan["groups"][_groups_of(plan, "hisparse_hot")[0]]["spec"]["blocks_per_request"] = 1


def _transfer_flipped(plan: dict[str, Any]) -> None:
    group = plan["groups"][_groups_of(plan, "hisparse_hot")[0]]
    group["enable_kv_transfer"] = not group["enable_kv_transfer"]


def _roles_swapped(plan: dict[str, Any]) -> None:
    source, indexer = plan["groups"][0], plan["groups"][1]
    source["role"], indexer["role"] = indexer["role"], source["role"]


def _indexer_role_default(plan: dict[str, Any]) -> None:
    plan["groups"][1]["role"] = "default"


def _indexer_member_sparse(plan: dict[str, Any]) -> None:
    specs = plan["groups"][1]["spec"]["specs"]
    specs[next(iter(specs))]["cache_role"] = "sparse"


def _resident_groups_permuted(plan: dict[str, Any]) -> None:
    first, second = _groups_of(plan, "hisparse_resident")[:2]
    groups = plan["groups"]
    groups[first], groups[second] = groups[second], groups[first]


def _resident_and_hot_names_swapped(plan: dict[str, Any]) -> None:
    resident, hot = _groups_of(plan, "hisparse_resident")[0], _groups_of(plan, "hisparse_hot")[0]
    groups = plan["groups"]
    groups[resident]["layer_names"], groups[hot]["layer_names"] = (
        groups[hot]["layer_names"], groups[resident]["layer_names"])
    for tensor in plan["tensors"]:
        tensor["layers"] = [
            n.replace(".hisparse_hot", ".tmp").replace(".hisparse_resident", ".hisparse_hot")
            .replace(".tmp", ".hisparse_resident") if n in set(groups[resident]["layer_names"])
            | set(groups[hot]["layer_names"]) else n for n in tensor["layers"]]


def _num_blocks_lowered_consistently(plan: dict[str, Any]) -> None:
    plan["num_blocks"] -= 1
    pool = plan["device_pools"][0]
    pool["size"] -= pool["bytes_per_block"]
    for tensor in plan["tensors"]:
        if not tensor["host_resident"]:
            tensor["size"] = pool["size"]


def _decode_rows_raised(plan: dict[str, Any]) -> None:
    plan["workload"]["max_decode_query_len"] = 3  # 3 * top-k 2048 rows: more than 4096


def _shared_flag_flipped(plan: dict[str, Any]) -> None:
    """Flipped in both places a plan says it (the host pool and its entry in `pools`)."""
    plan["host_pool"]["shared"] = not plan["host_pool"]["shared"]
    plan["pools"][0]["shared"] = plan["host_pool"]["shared"]


def _indexer_layers_reordered(plan: dict[str, Any]) -> None:
    """Two indexer layers trade places everywhere: bytes stay sound, each reads the other's."""
    group = plan["groups"][1]
    names = group["layer_names"]
    names[0], names[1] = names[1], names[0]
    specs = group["spec"]["specs"]
    group["spec"]["specs"] = {name: specs[name] for name in names}
    for tensor in plan["tensors"]:
        if names[0] in tensor["layers"]:
            tensor["layers"] = [names[1] if n == names[0] else names[0] if n == names[1] else n
                                for n in tensor["layers"]]


def _available_bytes_changed(plan: dict[str, Any]) -> None:
    plan["device_pools"][0]["available_bytes"] += 2**30


def _stride_shows_sharing(plan: dict[str, Any]) -> bool:
    """Flipping `shared` shows in the plan only where the source page is not 4096-aligned."""
    return bool(plan["host_pool"]["bytes_per_block"] % 4096)


SEMANTIC_TAMPERS: list[tuple[Tamper, bool | Callable[[dict[str, Any]], bool]]] = [
    (_resident_block_size, True),
    (_hot_blocks_per_request, True),
    (_transfer_flipped, True),
    (_roles_swapped, True),
    (_indexer_role_default, True),
    (_indexer_member_sparse, True),
    (_resident_groups_permuted, True),
    (_resident_and_hot_names_swapped, True),
    (_num_blocks_lowered_consistently, True),
    (_decode_rows_raised, True),
    (_capacity_inflated, True),
    (_shared_flag_flipped, _stride_shows_sharing),
    (_available_bytes_changed, True),
    (_indexer_layers_reordered, False),
]
"""(tamper, whether the plan alone shows it); the request shows every one."""


@pytest.mark.parametrize(("tamper", "derivable"), SEMANTIC_TAMPERS)
@pytest.mark.parametrize("case", ["deepseek_v32_fp8", "index_share_every_4",
                                  "hisparse_hybrid_mamba_packed"])
def test_semantic_tampers_are_refused(
    tamper: Tamper, derivable: bool | Callable[[dict[str, Any]], bool], case: str
) -> None:
    request, _ = load(case)
    plan = _golden_plan(case)
    hp.check_plan(hp.KVCachePlan.model_validate(plan), request=request)
    if not isinstance(derivable, bool):
        derivable = derivable(plan)
    tamper(plan)
    try:
        tampered = hp.KVCachePlan.model_validate(plan)
    except ValidationError:
        return  # the contract's own validation already refuses it
    with pytest.raises(hp.PlanInvariantError):
        hp.check_plan(tampered, request=request)
    if derivable:
        with pytest.raises(hp.PlanInvariantError):
            hp.check_plan(tampered)
    else:
        hp.check_plan(tampered)  # sound bytes, sound meaning: only the request tells


def test_the_request_check_names_the_first_field_that_differs() -> None:
    request, _ = load("deepseek_v32_fp8")
    plan = _golden_plan("deepseek_v32_fp8")
    _indexer_layers_reordered(plan)
    with pytest.raises(hp.PlanInvariantError, match=r"plan\.groups\[1\]\.layer_names\[0\] is "):
        hp.check_plan(plan, request=request)
    other, _ = load("glm5_fp8_blhnc")
    with pytest.raises(hp.PlanInvariantError, match="the request gives"):
        hp.check_plan(_golden_plan("deepseek_v32_fp8"), request=other)
