"""`allocate` proves the plan with `check_plan` before touching memory, so the views a `Pools`
binds can never share a byte across block ids: only a sound plan ever gets pools."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")  # the backend is an extra: skip without it

from hypothesis import given, settings
from hypothesis import strategies as st

import hisparse_plan as hp
from hisparse_plan.torch import BackendError, UnsoundPlanError, allocate, meta_check
from hisparse_plan.torch.vllm import pools as pools_module
from support.planning_support import plan_or_none
from support.strategies import hisparse_requests
from support.torch_support import small_plan, tampered, tensor_index

LAYER = "model.extra.0.attn"
"""A tensor of three full-attention layers: with layer_stride 0 they share every page."""


def flattened() -> hp.KVCachePlan:
    """The small plan as JSON with one tensor's layer_stride set to 0, loaded back."""
    plan = small_plan()
    index = tensor_index(plan, LAYER)
    assert len(plan.tensors[index].layers) > 1

    def zero(dumped: dict[str, Any]) -> None:
        dumped["tensors"][index]["layer_stride"] = 0

    return hp.KVCachePlan.model_validate_json(tampered(plan, zero).model_dump_json())


def test_a_plan_whose_layers_share_pages_is_refused_before_memory_is_touched(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bad = flattened()
    with pytest.raises(hp.PlanInvariantError) as proof:
        hp.check_plan(bad)

    def untouched(*args: object, **kwargs: object) -> None:
        raise AssertionError("allocate touched memory for an unsound plan")

    monkeypatch.setattr(pools_module, "allocate_device_pool", untouched)
    monkeypatch.setattr(pools_module, "HostBuffer", untouched)
    with pytest.raises(UnsoundPlanError) as caught:
        allocate(bad, device="cpu", pin=False, prefault_threads=0)
    error = caught.value
    # One error for both families: the backend's refusal and check_plan's own finding.
    assert isinstance(error, BackendError)
    assert isinstance(error, hp.PlanInvariantError)
    assert str(error) == (
        f"allocate refuses a plan that check_plan does not prove sound: {proof.value}")
    assert (error.tensor, error.layer, error.block) == (
        proof.value.tensor, proof.value.layer, proof.value.block)
    assert type(error.__cause__) is hp.PlanInvariantError


def test_meta_check_refuses_it_too() -> None:
    with pytest.raises(UnsoundPlanError, match="check_plan does not prove sound"):
        meta_check(flattened())


def test_the_plan_pools_bind_cannot_be_swapped() -> None:
    with allocate(small_plan(), device="cpu", pin=False, prefault_threads=0) as pools:
        with pytest.raises(AttributeError):
            pools.plan = flattened()  # type: ignore[misc]
        assert pools.plan == small_plan()


def test_views_of_a_sound_plan_share_no_byte_across_block_ids() -> None:
    """The property the refusal protects, on real bytes: each layer's block 0 and block 1 are
    distinct storage, so a write to one block id never shows in another."""
    with allocate(small_plan(), device="cpu", pin=False, prefault_threads=0) as pools:
        for name, view in pools.views().items():
            view.zero_()
            view[1].fill_(1)
            assert not bool(view[0].ne(0).any()), f"{name}: block 1 wrote into block 0"


@st.composite
def nudged(draw: st.DrawFn) -> hp.KVCachePlan | None:
    """A generated plan with one tensor's offset or strides nudged (None when refused)."""
    plan = plan_or_none(draw(hisparse_requests(max_layers=4, small=True)))
    if plan is None:
        return None
    index = draw(st.integers(0, len(plan.tensors) - 1))
    field = draw(st.sampled_from(["offset", "block_stride", "layer_stride"]))
    value = draw(st.sampled_from([0, 1, 64, 4096]))
    lower = draw(st.booleans())

    def edit(dumped: dict[str, Any]) -> None:
        tensor = dumped["tensors"][index]
        tensor[field] = max(0, tensor[field] - value) if lower else value

    return tampered(plan, edit)


@settings(max_examples=60, deadline=None)
@given(nudged())
def test_allocate_refuses_exactly_what_check_plan_refuses(plan: hp.KVCachePlan | None) -> None:
    if plan is None:
        return
    try:
        hp.check_plan(plan)
    except hp.PlanInvariantError:
        with pytest.raises(UnsoundPlanError):
            allocate(plan, device="meta", pin=False)
        return
    with allocate(plan, device="meta", pin=False) as pools:
        assert pools.views()
