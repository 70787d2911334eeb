"""check_plan's geometry proof costs the same at any num_kv_heads, and stays exact.

LHBNC and BHLNC put a page's heads apart, one run per head. The proof sums those runs up by
arithmetic (checking/trains.py); these tests hold it to the brute-force referee on small
plans, with the run-by-run fallback switched off so the arithmetic paths are the ones judged.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import hisparse_plan as hp
from hisparse_plan.checking import trains as trains_module
from hisparse_plan.checking.trains import pool_trains
from hisparse_plan.views import plan_views
from support.oracle import total_bytes, violations

HEADS_APART = ["LHBNC", "BHLNC"]


def _request(heads: int, layout: str, *, layers: int = 2, sliding: bool = False,
             num_blocks: int | None = None) -> dict[str, Any]:
    specs: dict[str, Any] = {}
    for i in range(layers):
        spec: dict[str, Any] = {"kind": "full_attention", "block_size": 16,
                                "num_kv_heads": heads, "head_size": 8, "dtype": "bfloat16"}
        if sliding and i % 2:
            spec = {**spec, "kind": "sliding_window", "sliding_window": 32}
        specs[f"model.layers.{i}.attn"] = spec
    device: dict[str, Any] = {"available_bytes": 2**60, "kv_cache_layout": layout}
    if num_blocks is not None:
        device["num_blocks_override"] = num_blocks
    return {"layers": specs, "model": {"max_model_len": 16}, "device": device}


@pytest.mark.parametrize("layout", HEADS_APART)
def test_trains_do_not_grow_with_heads(layout: str) -> None:
    """Ten million heads give as many trains as one head: one per layer or per tensor."""
    counts = {
        heads: len(pool_trains(plan_views(hp.plan(_request(heads, layout, layers=3))).values()))
        for heads in (1, 2, 10**7)
    }
    assert counts[10**7] == counts[2] <= 3, counts


@pytest.mark.parametrize("layout", HEADS_APART)
def test_ten_million_heads_are_proved(layout: str) -> None:
    hp.check_plan(hp.plan(_request(10**7, layout, sliding=True)))


@pytest.mark.parametrize("layout", HEADS_APART)
def test_a_shifted_tensor_with_ten_million_heads_is_refused(layout: str) -> None:
    """Moving the second group's tensor half a head onto the first breaks the plan; the proof
    still names a layer."""
    plan = hp.plan(_request(10**7, layout, sliding=True)).model_dump(mode="json")
    assert len(plan["tensors"]) == 2
    plan["tensors"][1]["offset"] += 16 * 8 * 2 * (2 if layout == "BHLNC" else 1) // 2
    with pytest.raises(hp.PlanInvariantError, match=r"tensors\[\d\] layer 'model\.layers"):
        hp.check_plan(hp.KVCachePlan.model_validate(plan))


def test_heads_one_block_train_apart_name_the_head() -> None:
    """Shifting an LHBNC layer by one block stride puts its head h, last block, on head h+1's
    block 0 of the other layer's group: reported with block and head."""
    plan = hp.plan(_request(4, "LHBNC", layers=2, sliding=True, num_blocks=4))
    dumped = plan.model_dump(mode="json")
    dumped["tensors"][1]["offset"] += dumped["tensors"][1]["block_stride"]
    with pytest.raises(hp.PlanInvariantError, match=r"block \d head \d"):
        hp.check_plan(hp.KVCachePlan.model_validate(dumped))


def test_unsummable_heads_are_refused_not_listed(monkeypatch: pytest.MonkeyPatch) -> None:
    """BHLNC layers spaced wider than a head's run cannot be summed up; beyond the listing
    bound the proof refuses them instead of listing every head."""
    monkeypatch.setattr(trains_module, "MAX_LISTED_RUNS", 0)
    plan = hp.plan(_request(4, "BHLNC", layers=2, num_blocks=2)).model_dump(mode="json")
    plan["tensors"][0]["layer_stride"] *= 2
    with pytest.raises(hp.PlanInvariantError, match="cannot be proved disjoint without listing"):
        hp.check_plan(hp.KVCachePlan.model_validate(plan))


@st.composite
def heads_apart_requests(draw: st.DrawFn) -> dict[str, Any]:
    """Small plans whose pages have 1-5 heads apart, in one or more groups."""
    count = draw(st.integers(1, 5))
    block_size = draw(st.sampled_from([1, 2, 4]))
    specs: dict[str, Any] = {}
    for i in range(count):
        spec: dict[str, Any] = {
            "kind": draw(st.sampled_from(["full_attention", "sliding_window"])),
            "block_size": block_size,
            "num_kv_heads": draw(st.integers(1, 5)),
            "head_size": draw(st.integers(1, 6)),
            "dtype": draw(st.sampled_from(["uint8", "bfloat16", "float32"])),
        }
        if spec["kind"] == "sliding_window":
            spec["sliding_window"] = draw(st.integers(1, 8))
        specs[f"model.layers.{i}.attn"] = spec
    return {
        "layers": specs,
        "model": {"max_model_len": draw(st.integers(1, 8))},
        "device": {"available_bytes": 2**40,
                   "kv_cache_layout": draw(st.sampled_from(HEADS_APART)),
                   "num_blocks_override": draw(st.integers(1, 5))},
    }


def _plan_or_none(request: dict[str, Any]) -> hp.KVCachePlan | None:
    try:
        plan = hp.plan(request)
    except hp.PlanError:
        return None
    return plan if total_bytes(plan) <= 200_000 else None


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(
    heads_apart_requests(),
    st.sampled_from(["offset", "layer_stride", "block_stride"]),
    st.integers(min_value=-3, max_value=3),
    st.sampled_from(["byte", "element", "run", "block"]),
    st.booleans(),
    st.data(),
)
def test_summed_up_heads_agree_with_enumeration(
    request: dict[str, Any], field: str, steps: int, unit: str, listing: bool,
    data: st.DataObject,
) -> None:
    """Sound plans are proved; a tampered plan is refused exactly when the referee finds a
    fault, except that an unsummable page may be refused for that alone."""
    plan = _plan_or_none(request)
    assume(plan is not None)
    assert plan is not None
    dumped = copy.deepcopy(plan.model_dump(mode="json"))
    index = data.draw(st.integers(0, len(dumped["tensors"]) - 1))
    tensor = dumped["tensors"][index]
    view = plan_views(plan)[tensor["layers"][0]]
    head_run = view.shape[2] * view.shape[3] * view.itemsize
    size = {"byte": 1, "element": view.itemsize, "run": head_run,
            "block": view.block_stride}[unit]
    tensor[field] += steps * size
    assume(tensor[field] >= 0)
    tampered = hp.KVCachePlan.model_validate(dumped)
    truth = violations(tampered)
    saved = trains_module.MAX_LISTED_RUNS
    trains_module.MAX_LISTED_RUNS = saved if listing else 0
    try:
        hp.check_plan(tampered)
        verdict = ""
    except hp.PlanInvariantError as error:
        verdict = str(error)
    finally:
        trains_module.MAX_LISTED_RUNS = saved
    if truth:
        assert verdict, truth
    elif verdict:
        assert not listing, verdict
        assert "cannot be proved disjoint without listing" in verdict, verdict
    if steps == 0:
        assert not truth, truth
        assert not verdict, verdict


@pytest.mark.parametrize("heads", [1, 3, 10**6])
def test_a_group_moved_one_block_meets_another_block_id(heads: int) -> None:
    """LHBNC, three full and two sliding layers: the one-layer full group moved one block
    stride stays inside the pool but puts its block b on the other groups' block b + 1."""
    plan = hp.plan(_request(heads, "LHBNC", layers=5, sliding=True, num_blocks=6))
    dumped = plan.model_dump(mode="json")
    short = next(i for i, t in enumerate(dumped["tensors"]) if len(t["layers"]) == 1)
    dumped["tensors"][short]["offset"] += dumped["tensors"][short]["block_stride"]
    tampered = hp.KVCachePlan.model_validate(dumped)
    if heads < 10:
        assert violations(tampered)
    with pytest.raises(hp.PlanInvariantError, match="different block ids"):
        hp.check_plan(tampered)
