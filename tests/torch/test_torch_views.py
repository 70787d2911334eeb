"""Layer views on real and meta pools: the plan's strides and offsets, to the byte."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")  # the backend is an extra: skip without it

from hisparse_plan.torch import (
    TORCH_DTYPES,
    BackendError,
    UnsoundPlanError,
    allocate,
    bind_views,
    check_bound,
    meta_check,
)
from hisparse_plan.views import plan_views
from support.golden import CASES, load
from support.planning_support import plan_or_none
from support.torch_support import golden_plan, small_plan, tampered, tensor_index, torch

PLANNED = [case for case in CASES if "error" not in load(case)[1]]
"""The golden cases that plan (the others expect a refusal)."""


def test_every_view_has_the_plans_numbers() -> None:
    plan = small_plan()
    with allocate(plan, device="cpu", pin=False, prefault_threads=0) as pools:
        bound = pools.views()
        expected = plan_views(plan)
        assert list(bound) == list(expected)
        for name, view in expected.items():
            tensor = bound[name]
            pool = pools.host if view.host_resident else pools.device
            assert pool is not None
            check_bound(view, tensor, pool)
            itemsize = tensor.element_size()
            assert tensor.dtype == TORCH_DTYPES[view.dtype]
            assert tensor.storage_offset() * itemsize == view.offset
            assert tuple(s * itemsize for s in tensor.stride()) == view.strides
            assert tensor.untyped_storage().data_ptr() == pool.data_ptr()


def test_view_shapes_by_kind() -> None:
    plan = small_plan()
    with allocate(plan, device="cpu", pin=False, prefault_threads=0) as pools:
        views = pools.views()
    sparse = views["model.layers.1.self_attn.attn"]
    assert (tuple(sparse.shape), sparse.dtype) == ((130, 1, 64, 576), torch.bfloat16)
    full = views["model.extra.2.attn"]
    assert (tuple(full.shape), full.dtype) == ((plan.num_blocks, 2, 64, 128), torch.bfloat16)
    hot = views["model.layers.3.self_attn.attn.hisparse_hot"]
    assert (tuple(hot.shape), hot.dtype) == ((plan.num_blocks, 73728), torch.uint8)


def test_a_write_lands_where_the_plan_says() -> None:
    plan = small_plan()
    index = tensor_index(plan, "model.extra.0.attn")
    tensor = plan.tensors[index]
    with allocate(plan, device="cpu", pin=False, prefault_threads=0) as pools:
        pools.device.zero_()
        view = pools.views()["model.extra.2.attn"]
        # Layer 2 of the tensor, block 5, head 1, token 3, element 7 (BLNHC: N before H).
        view[5, 1, 3, 7] = torch.tensor(1.0, dtype=torch.bfloat16)
        heads, row = 2, 128 * 2
        address = (tensor.offset + 2 * tensor.layer_stride + 5 * tensor.block_stride
                   + 3 * heads * row + 1 * row + 7 * 2)
        nonzero = torch.nonzero(pools.device).flatten().tolist()
        # bfloat16 1.0 is 0x3F80, little-endian: exactly the element's two bytes change.
        assert nonzero == [address, address + 1]
        assert pools.device[address:address + 2].tolist() == [0x80, 0x3F]


def test_a_view_past_the_pool_is_a_backend_error() -> None:
    plan = small_plan()
    index = tensor_index(plan, "model.layers.0.self_attn.indexer.k_cache")

    def stretch(dumped: dict[str, Any]) -> None:
        dumped["tensors"][index]["block_stride"] += 16384

    bad = tampered(plan, stretch)
    tensor, size, blocks = bad.tensors[index], bad.device_pool.size, bad.num_blocks
    page = 64 * 128 * 2
    # The first layer whose pages run past the pool, and its first block that does.
    layer, block = min(
        (layer, block)
        for layer in range(len(tensor.layers))
        for block in [(size - tensor.offset - layer * tensor.layer_stride - page)
                      // tensor.block_stride + 1]
        if block < blocks
    )
    offset = tensor.offset + layer * tensor.layer_stride
    with pytest.raises(UnsoundPlanError):
        allocate(bad, device="cpu", pin=False, prefault_threads=0)
    # Bound by hand on the sound plan's pools, the binding's own check names it.
    with allocate(plan, device="cpu", pin=False, prefault_threads=0) as pools, \
            pytest.raises(BackendError) as caught:
        bind_views(bad, pools.host, pools.device)
    assert str(caught.value) == (
        f"tensors[{index}] layer {tensor.layers[layer]!r}: block {block}'s page ends at byte "
        f"{offset + block * tensor.block_stride + page}, past the device pool's {size} bytes; "
        f"expected all {blocks} blocks inside the pool (offset {offset}, block stride "
        f"{tensor.block_stride})")


def test_a_misaligned_view_is_a_backend_error() -> None:
    plan = small_plan()
    index = tensor_index(plan, "model.extra.0.attn")

    def shift(dumped: dict[str, Any]) -> None:
        dumped["tensors"][index]["offset"] += 1

    bad = tampered(plan, shift)
    with pytest.raises(UnsoundPlanError):
        allocate(bad, device="cpu", pin=False, prefault_threads=0)
    with allocate(plan, device="cpu", pin=False, prefault_threads=0) as pools, \
            pytest.raises(BackendError, match="offset 1 is not a multiple of the bfloat16 size 2"):
        bind_views(bad, pools.host, pools.device)


def test_meta_check_of_deepseek_v32() -> None:
    plan = golden_plan("deepseek_v32_fp8")
    report = meta_check(plan)
    assert (report.host_bytes, report.device_bytes) == (68717395968, 64424196096)
    assert report.layers == 61 * 4
    indexer = report.views["model.layers.60.self_attn.indexer.k_cache"]
    assert (tuple(indexer.shape), indexer.stride(), indexer.storage_offset()) == (
        (118038, 1, 64, 132), (545792, 132, 132, 1), 60 * 8448)
    source = report.views["model.layers.60.self_attn.attn"]
    assert (tuple(source.shape), source.stride(), source.storage_offset()) == (
        (26832, 1, 64, 656), (41984, 656, 656, 1), 60 * 1126514688)
    hot = report.views["model.layers.60.self_attn.attn.hisparse_hot"]
    assert (tuple(hot.shape), hot.stride(), hot.device.type) == (
        (118038, 41984), (545792, 1), "meta")


@pytest.mark.parametrize("case", PLANNED)
def test_meta_check_of_every_golden_plan(case: str) -> None:
    plan = plan_or_none(load(case)[0])
    assert plan is not None
    report = meta_check(plan)
    views = plan_views(plan)
    assert list(report.views) == list(views)
    assert report.stage_bytes == tuple(pool.size for pool in plan.device_pools)
    assert report.device_bytes == sum(pool.size for pool in plan.device_pools)
    host_size = 0 if plan.host_pool is None else plan.host_pool.size
    assert report.host_bytes >= host_size
    for name, tensor in report.views.items():
        # On the storage of its own stage's pool, at full size.
        stage = views[name].stage
        pool_bytes = report.host_bytes if views[name].host_resident else report.stage_bytes[stage]
        assert (tensor.device.type, tensor.untyped_storage().nbytes()) == ("meta", pool_bytes)


def test_meta_check_of_the_pipeline_golden_plan_by_stage() -> None:
    plan = golden_plan("regular_llama3_70b_pp4_autofit")
    assert len(plan.device_pools) == 4
    for stage, pool in enumerate(plan.device_pools):
        report = meta_check(plan, stage=stage)
        assert pool.layers is not None
        assert (list(report.views), report.stage_bytes) == (pool.layers, (pool.size,))
        assert report.layers == 20
    with pytest.raises(BackendError, match="stage is 4, but the plan has 4 pipeline stages; "
                                           "expected 0 to 3"):
        meta_check(plan, stage=4)


def test_meta_check_refuses_a_view_past_the_pool() -> None:
    plan = golden_plan("deepseek_v32_fp8")

    def shift(dumped: dict[str, Any]) -> None:
        dumped["tensors"][0]["offset"] += 41984

    with pytest.raises(UnsoundPlanError, match=(
            r"check_plan does not prove sound: tensors\[0\] layer 'model.layers.60.self_attn.attn' "
            r"block 26831 ends at byte 68717437952, past the host pool's")) as caught:
        meta_check(tampered(plan, shift))
    assert (caught.value.tensor, caught.value.block) == (0, 26831)
