"""Pipeline stages: `allocate(plan, stage=k)` holds only stage k's device pool, binds and
verifies only its layers, and refuses a layer of another stage by name."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")  # the backend is an extra: skip without it

import hisparse_plan as hp
from hisparse_plan.torch import (
    BackendError,
    UnsoundPlanError,
    VerifyError,
    allocate,
    bind_views,
    verify,
)
from hisparse_plan.torch.vllm import pools as pools_module
from hisparse_plan.views import plan_views
from support.torch_support import pipeline_small_request, plan_of, small_plan, tampered, torch

STAGE_LAYERS = [[f"model.layers.{i}.self_attn.attn" for i in (2 * k, 2 * k + 1)]
                for k in range(4)]


@pytest.fixture(scope="module")
def plan() -> hp.KVCachePlan:
    planned = plan_of(pipeline_small_request())
    assert [pool.layers for pool in planned.device_pools] == STAGE_LAYERS
    return planned


def _cpu(plan: hp.KVCachePlan, stage: int | None) -> Any:
    return allocate(plan, device="cpu", pin=False, prefault_threads=0, stage=stage)


@pytest.mark.parametrize("stage", range(4))
def test_a_stage_allocates_its_own_pool_and_layers(plan: hp.KVCachePlan, stage: int) -> None:
    with _cpu(plan, stage) as pools:
        assert (pools.stage, pools.device.numel()) == (stage, plan.device_pools[stage].size)
        assert pools.host is None
        views = pools.views()
        assert list(views) == STAGE_LAYERS[stage]
        assert f"stage {stage} device pool: " in pools.summary()
        planned = plan_views(plan)
        for name, tensor in views.items():
            assert tensor.storage_offset() * tensor.element_size() == planned[name].offset
            assert tensor.untyped_storage().data_ptr() == pools.device.data_ptr()


def test_a_write_lands_in_the_stage_pool_where_the_plan_says(plan: hp.KVCachePlan) -> None:
    index = next(i for i, t in enumerate(plan.tensors) if t.layers[0] == STAGE_LAYERS[2][0])
    tensor = plan.tensors[index]
    with _cpu(plan, 2) as pools:
        pools.device.zero_()
        view = pools.view(STAGE_LAYERS[2][1])
        # BLNHC: block 3, head 5, token 1, element 9 of the stage's second layer.
        view[3, 5, 1, 9] = torch.tensor(1.0, dtype=torch.bfloat16)
        heads, row = 8, 256 * 2
        address = (tensor.offset + tensor.layer_stride + 3 * tensor.block_stride
                   + 1 * heads * row + 5 * row + 9 * 2)
        assert torch.nonzero(pools.device).flatten().tolist() == [address, address + 1]


def test_a_layer_of_another_stage_is_refused(plan: hp.KVCachePlan) -> None:
    with _cpu(plan, 1) as pools:
        with pytest.raises(BackendError) as caught:
            pools.view("model.layers.6.self_attn.attn")
        assert str(caught.value) == (
            "layer 'model.layers.6.self_attn.attn' belongs to pipeline stage 3, but these pools "
            "hold stage 1's device pool; expected a layer of stage 1, or allocate(plan, "
            "stage=3) for this one")
        with pytest.raises(BackendError, match=r"layer 'model\.layers\.99\.self_attn\.attn' is not "
                                               "placed by any tensor of the plan"):
            pools.view("model.layers.99.self_attn.attn")
        assert "model.layers.6.self_attn.attn" not in pools.views()


def test_verify_checks_the_stage_it_was_given(plan: hp.KVCachePlan) -> None:
    with _cpu(plan, 2) as pools:
        report = verify(plan, pools)
    assert (report.groups, report.layers, report.pages, report.sampled) == (
        1, 2, 2 * plan.num_blocks, False)
    assert report.bytes == 2 * plan.num_blocks * 16 * 8 * 128 * 2 * 2


def test_a_fault_in_a_stage_fails_that_stage_only(plan: hp.KVCachePlan) -> None:
    index = next(i for i, t in enumerate(plan.tensors) if t.layers[0] == STAGE_LAYERS[3][0])

    def overlap(dumped: dict[str, Any]) -> None:
        # The stage's second layer half a page after its first: their pages share bytes.
        dumped["tensors"][index]["layer_stride"] //= 2

    bad = tampered(plan, overlap)
    with _cpu(plan, 3) as pools, pytest.raises(VerifyError) as caught:
        verify(bad, pools)
    assert caught.value.layer in STAGE_LAYERS[3]
    with _cpu(plan, 1) as pools:
        assert verify(bad, pools).layers == 2


def test_a_tensor_that_disagrees_with_its_stage_pool_is_refused(
    plan: hp.KVCachePlan, monkeypatch: pytest.MonkeyPatch
) -> None:
    index = next(i for i, t in enumerate(plan.tensors) if t.layers[0] == STAGE_LAYERS[2][0])

    def grow(dumped: dict[str, Any]) -> None:
        dumped["tensors"][index]["size"] += 4096

    bad = tampered(plan, grow)
    size = plan.device_pools[2].size
    for stage in (2, 1):  # an unsound plan is refused whole, for every stage
        with pytest.raises(UnsoundPlanError, match="check_plan does not prove sound"):
            _cpu(bad, stage)
    # Behind check_plan, the backend's own guard names the tensor and its stage's pool.
    monkeypatch.setattr(pools_module, "check_sound", lambda plan: None)
    with pytest.raises(BackendError, match=(
            rf"tensors\[{index}\] \('model.layers.4.self_attn.attn'\) says its pool has "
            rf"{size + 4096} bytes; expected {size}, the plan's device_pools\[2\].size")):
        _cpu(bad, 2)
    _cpu(bad, 1).release()  # another stage's pool is unaffected


@pytest.mark.parametrize(("stage", "message"), [
    (None, "the plan has 4 pipeline stages, each with its own device pool (device_pools); "
           "expected stage= naming the one to allocate, 0 to 3"),
    (4, "stage is 4, but the plan has 4 pipeline stages; expected 0 to 3"),
    (-1, "stage is -1, but the plan has 4 pipeline stages; expected 0 to 3"),
    (True, "stage is True; expected an integer stage index or None"),
])
def test_a_pipeline_plan_needs_a_stage(
    plan: hp.KVCachePlan, stage: Any, message: str
) -> None:
    with pytest.raises(BackendError) as caught:
        _cpu(plan, stage)
    assert str(caught.value) == message
    with pytest.raises(BackendError) as caught:
        bind_views(plan, None, torch.empty(0, dtype=torch.uint8), stage)
    assert str(caught.value) == message


def test_a_one_stage_plan_takes_stage_0_or_none() -> None:
    one = small_plan()
    for stage in (None, 0):
        with _cpu(one, stage) as pools:
            assert pools.stage == 0
            assert list(pools.views()) == list(plan_views(one))
    with pytest.raises(BackendError) as caught:
        _cpu(one, 1)
    assert str(caught.value) == (
        "stage is 1, but the plan has 1 pipeline stage; expected 0 (or None)")
