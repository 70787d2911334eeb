"""Layout fingerprints, transfer manifests and transfer compatibility (hisparse_plan.exchange)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

import hisparse_plan as hp
from hisparse_plan.exchange import (
    LAYOUT_FIELDS,
    TransferManifest,
    diff,
    fingerprint,
    manifest,
)
from hisparse_plan.models import (
    Capacity,
    HisparseHotSpec,
    KVCacheLayout,
    KVCachePlan,
    dtype_size,
)
from hisparse_plan.views import plan_views, pool_name
from support.golden import CASES as GOLDEN_CASES
from support.golden import load


def _plannable() -> list[str]:
    """The golden cases that plan (the others are refusals)."""
    found = []
    for case in GOLDEN_CASES:
        try:
            hp.plan(hp.PlanRequest.model_validate(load(case)[0]))
        except (hp.PlanError, ValidationError):
            continue
        found.append(case)
    return found


CASES = _plannable()
PIPELINE = "regular_llama3_70b_pp4_autofit"
DEEPSEEK_FINGERPRINT = "3cd69ea6c380a5508db5c8ebcd6d2cfa3f40b3a98d8f311d87c2613e4a0c7d21"
"""The golden DeepSeek-V3.2 plan's: a change here means every published fingerprint changes
(bump FINGERPRINT_VERSION if that is meant)."""


def planned(case: str, **changes: Any) -> KVCachePlan:
    request = load(case)[0]
    for path, value in changes.items():
        node = request
        *parents, last = path.split("__")
        for part in parents:
            node = node[part]
        node[last] = value
    return hp.plan(hp.PlanRequest.model_validate(request))


def changed(plan: KVCachePlan, where: str, index: int | None = None, **fields: Any) -> KVCachePlan:
    """A copy of `plan` with fields of one part replaced (`where` = "tensors", "host_pool",
    "device_pools", "groups", or "" for the plan itself)."""
    if not where:
        return plan.model_copy(update=fields)
    part = getattr(plan, where)
    if index is None:
        return plan.model_copy(update={where: part.model_copy(update=fields)})
    items = list(part)
    items[index] = items[index].model_copy(update=fields)
    return plan.model_copy(update={where: items})


# -- fingerprint ---------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_two_plans_of_one_request_match(case: str) -> None:
    first, second = planned(case), planned(case)
    again = KVCachePlan.model_validate_json(first.model_dump_json())
    assert fingerprint(first) == fingerprint(second) == fingerprint(again)
    assert manifest(first) == manifest(second)
    result = diff(first, second)
    assert result.compatible
    assert result.same_fingerprint


def test_the_fingerprint_is_stable() -> None:
    assert fingerprint(planned("deepseek_v32_fp8")) == DEEPSEEK_FINGERPRINT


def test_metadata_does_not_change_the_fingerprint() -> None:
    plan = planned("deepseek_v32_fp8")
    assert plan.host_pool is not None
    variants = [
        changed(plan, "", capacity=Capacity(max_concurrency=1.0, steady_state_concurrency=None),
                warnings=["something"]),
        changed(plan, "", workload=plan.workload.model_copy(update={"max_model_len": 4096})),
        changed(plan, "host_pool", budget_bytes=plan.host_pool.budget_bytes + 12345),
        changed(plan, "device_pools", 0, available_bytes=1, num_blocks_override=7),
        changed(plan, "groups", 0, enable_kv_transfer=True, role="default"),
        # How many hot blocks a request takes is sizing, not placement.
        changed(plan, "groups", 8, spec=plan.groups[8].spec.model_copy(
            update={"blocks_per_request": 1})),
    ]
    for variant in variants:
        assert fingerprint(variant) == fingerprint(plan)


@pytest.mark.parametrize("field", ["offset", "layer_stride", "block_stride", "size"])
def test_every_tensor_number_changes_the_fingerprint(field: str) -> None:
    plan = planned("glm5_fp8_blhnc")
    seen = {fingerprint(plan)}
    for index, tensor in enumerate(plan.tensors):
        moved = changed(plan, "tensors", index, **{field: getattr(tensor, field) + 1})
        seen.add(fingerprint(moved))
    assert len(seen) == len(plan.tensors) + 1


def test_every_pool_and_group_number_changes_the_fingerprint() -> None:
    plan = planned("deepseek_v32_fp8")
    host, device = plan.host_pool, plan.device_pools[0]
    assert host is not None
    group = plan.groups[2]
    variants = [
        changed(plan, "", num_blocks=plan.num_blocks - 1),
        changed(plan, "host_pool", num_blocks=host.num_blocks - 1),
        changed(plan, "host_pool", block_stride=host.block_stride + 4096),
        changed(plan, "host_pool", bytes_per_block=host.bytes_per_block + 1),
        changed(plan, "host_pool", shared=True),
        changed(plan, "host_pool", layout=KVCacheLayout.LBHNC),
        changed(plan, "device_pools", 0, layout=KVCacheLayout.BLHNC),
        changed(plan, "device_pools", 0, bytes_per_block=device.bytes_per_block + 1),
        changed(plan, "device_pools", 0, size=device.size + 1),
        changed(plan, "device_pools", 0, layers=list(plan.tensors[1].layers)),
        changed(plan, "groups", 2, layer_names=list(reversed(group.layer_names))),
        changed(plan, "groups", 2, spec=group.spec.model_copy(
            update={"page_size_bytes": group.spec.page_size_bytes + 1})),
        changed(plan, "groups", 2, host_resident=True),
        # A resident group turned hot, same numbers: the kind is part of the layout.
        changed(plan, "groups", 2, spec=HisparseHotSpec(
            block_size=group.spec.block_size, page_size_bytes=group.spec.page_size_bytes,
            blocks_per_request=64)),
    ]
    prints = [fingerprint(variant) for variant in variants]
    assert fingerprint(plan) not in prints
    assert len(set(prints)) == len(prints)


# -- manifest --------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_manifest_round_trips_json(case: str) -> None:
    plan = planned(case)
    result = manifest(plan)
    text = result.model_dump_json()
    assert TransferManifest.model_validate_json(text) == result
    assert TransferManifest.model_validate_json(text).model_dump_json() == text
    assert diff(plan, TransferManifest.model_validate_json(text)).same_fingerprint


@pytest.mark.parametrize("case", CASES)
def test_manifest_is_the_plans_views(case: str) -> None:
    plan = planned(case)
    result = manifest(plan)
    views = plan_views(plan)
    regions = {region.name: region for region in result.regions}
    assert [entry.name for entry in result.layers] == list(views)
    for entry in result.layers:
        view = views[entry.name]
        tensor = plan.tensors[entry.tensor]
        assert entry.name in tensor.layers
        assert entry.region == pool_name(plan, view.stage, view.host_resident)
        assert (entry.offset, entry.block_stride, entry.layer_stride) == (
            view.offset, tensor.block_stride, tensor.layer_stride)
        assert entry.block_offset == view.offset % view.block_stride
        assert tuple(entry.block_shape) == view.shape[1:]
        assert tuple(entry.block_strides) == view.strides[1:]
        assert (entry.page_bytes, entry.dtype, entry.num_blocks) == (
            view.page_size_bytes, view.dtype, view.num_blocks)
        assert entry.derived == entry.name.endswith((".hisparse_resident", ".hisparse_hot"))
        assert entry.run_bytes * len(entry.run_starts) <= entry.page_bytes
        # The last byte of the last block's page lies inside the region.
        region = regions[entry.region]
        last = entry.offset + (entry.num_blocks - 1) * entry.block_stride
        assert last + max(entry.run_starts) + entry.run_bytes <= region.size
        assert region.alignment % dtype_size(entry.dtype) == 0
    assert len(regions) == len(result.regions)
    for stage, device in enumerate(plan.device_pools):
        region = regions[pool_name(plan, stage)]
        assert (region.size, region.stage, region.layout) == (device.size, stage, device.layout)
        assert region.num_blocks == plan.num_blocks
    host = plan.host_pool
    assert (host is None) == ("host" not in regions)
    if host is not None:
        assert (regions["host"].size, regions["host"].shared) == (host.size, host.shared)
        if host.shared:
            assert regions["host"].alignment == 4096


def test_pipeline_stages_are_regions_of_their_own() -> None:
    plan = planned(PIPELINE)
    result = manifest(plan)
    assert [region.name for region in result.regions] == [
        f"stage {stage} device" for stage in range(len(plan.device_pools))]
    for stage, device in enumerate(plan.device_pools):
        assert device.layers is not None
        placed = {entry.name for entry in result.layers if entry.region == f"stage {stage} device"}
        assert placed == set(device.layers)
    assert diff(plan, planned(PIPELINE)).same_fingerprint


def test_a_shared_host_pool_is_page_aligned() -> None:
    result = manifest(planned("deepseek_v32_fp8_mtp3_shared_pool"))
    host = next(region for region in result.regions if region.name == "host")
    assert host.shared
    assert host.alignment == 4096
    assert host.block_stride % 4096 == 0
    assert host.block_stride > host.bytes_per_block  # pages span less than the mapping


# -- compatibility ---------------------------------------------------------------------------------


def test_pool_sizes_may_differ() -> None:
    prefill = planned("deepseek_v32_fp8")
    decode = planned("deepseek_v32_fp8", device__available_bytes=100 * 2**30,
                     hisparse__host_pool_gib=200.0)
    assert decode.num_blocks != prefill.num_blocks
    result = diff(prefill, decode)
    assert result.compatible
    assert not result.same_fingerprint
    assert result.layers_compared == 122  # 61 source + 61 indexer; hot and resident are derived


def test_layouts_that_place_pages_alike_are_compatible() -> None:
    # One head per MLA page: BLHNC and BLNHC put every byte of a page at the same place.
    result = diff(planned("deepseek_v32_fp8"),
                  planned("deepseek_v32_fp8", device__kv_cache_layout="BLHNC"))
    assert result.compatible
    assert not result.same_fingerprint


def test_one_stride_changed_is_incompatible_naming_the_layer() -> None:
    plan = planned("deepseek_v32_fp8")
    indexer = plan.tensors[1]
    assert indexer.layers[0] == "model.layers.0.self_attn.indexer.k_cache"
    wider = changed(plan, "tensors", 1, layer_stride=indexer.layer_stride + 132)
    result = diff(plan, wider)
    assert not result.compatible
    assert result.layer == "model.layers.1.self_attn.indexer.k_cache"
    assert result.field == "block_offset"
    assert (result.a, result.b) == (8448, 8448 + 132)
    assert "model.layers.1.self_attn.indexer.k_cache" in result.message


@pytest.mark.parametrize(("field", "value"), [
    ("dtype", "bfloat16"),
    ("page_bytes", 41985),
    ("tokens_per_block", 32),
    ("block_shape", [1, 32, 1312]),
    ("block_strides", [656, 1312, 1]),
])
def test_each_page_field_is_compared(field: str, value: Any) -> None:
    assert field in LAYOUT_FIELDS
    base = manifest(planned("deepseek_v32_fp8"))
    layers = list(base.layers)
    victim = 5
    layers[victim] = layers[victim].model_copy(update={field: value})
    result = diff(base, base.model_copy(update={"layers": layers}))
    assert not result.compatible
    assert (result.layer, result.field) == (layers[victim].name, field)


def test_strides_of_single_element_axes_are_not_compared() -> None:
    base = manifest(planned("deepseek_v32_fp8"))
    layers = list(base.layers)
    # The heads axis has one head: its stride addresses nothing.
    layers[0] = layers[0].model_copy(update={"block_strides": [999, 656, 1]})
    assert diff(base, base.model_copy(update={"layers": layers})).compatible


def test_derived_layers_are_not_compared() -> None:
    base = manifest(planned("deepseek_v32_fp8"))
    layers = [entry.model_copy(update={"page_bytes": 1}) if entry.derived else entry
              for entry in base.layers]
    assert diff(base, base.model_copy(update={"layers": layers})).compatible


def test_a_missing_layer_is_named() -> None:
    deepseek, glm = planned("deepseek_v32_fp8"), planned("glm5_fp8_blhnc")
    result = diff(deepseek, glm)
    assert not result.compatible
    assert (result.layer, result.field, result.a, result.b) == (
        "model.layers.61.self_attn.attn", "present", False, True)
    assert diff(glm, deepseek).message == (
        "layer 'model.layers.61.self_attn.attn' is transferred by A only")
