"""check_plan's proof of engine views (checking/views.py), judged by a brute-force oracle that
lists every byte (view_oracle): every plan the SGLang target makes has sound views, the edits
the adversary found accepted are refused, spare rows are taken only where no page is, and any
single edit of a view that check_plan accepts is sound byte by byte."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hisparse_plan as hp
from hisparse_plan.adapters.sglang import sglang_request
from hisparse_plan.models.sglang_plan import SGLangPlan
from hisparse_plan.models.sglang_settings import SGLangSettings
from hisparse_plan.presets import load_preset
from hisparse_plan.targets.sglang import plan_sglang
from support.sglang_cases import MIB, TINY, tiny_dump, tiny_plan
from support.view_oracle import view_faults

Edit = Callable[[dict[str, Any]], None]


def _validated(dumped: dict[str, Any]) -> SGLangPlan:
    return SGLangPlan.model_validate(dumped)


@pytest.mark.parametrize("case", list(TINY))
def test_the_targets_views_are_sound_byte_by_byte(case: str) -> None:
    plan = tiny_plan(case)
    hp.check_plan(plan, request=TINY[case]())
    assert view_faults(plan) == []


# --- the adversary's edits of a Llama-3-8B plan -----------------------------------------------


def llama_plan() -> dict[str, Any]:
    """Llama-3-8B on SGLang with 64 MiB of pools: per layer [2, 257, 8, 128] bf16, K then V."""
    engine = SGLangSettings(name="sglang", context_length=128)
    req = sglang_request(load_preset("llama-3-8b").architecture, engine, available_bytes=64 * MIB)
    return plan_sglang(req).model_dump(mode="json")


def _k_buffer(plan: dict[str, Any]) -> dict[str, Any]:
    view: dict[str, Any] = plan["tensors"][0]["views"][0]
    assert (view["name"], view["strides"]) == ("k_buffer", [1024, 128, 1])
    return view


def _heads_stride(value: int) -> Edit:
    def edit(plan: dict[str, Any]) -> None:
        _k_buffer(plan)["strides"][1] = value

    return edit


def _element_stride_two(plan: dict[str, Any]) -> None:
    _k_buffer(plan)["strides"][2] = 2


def _rows_into_v(plan: dict[str, Any]) -> None:
    _k_buffer(plan)["shape"][0] += 35


@pytest.mark.parametrize("edit", [_heads_stride(9509), _heads_stride(1024), _element_stride_two,
                                  _rows_into_v],
                         ids=["heads_stride_9509", "heads_stride_1024", "element_stride_2",
                              "rows_plus_35"])
def test_the_adversarys_view_edits_are_refused(edit: Edit) -> None:
    plan = llama_plan()
    hp.check_plan(plan)
    edit(plan)
    bad = _validated(plan)
    assert view_faults(bad), "the oracle must see the edit's fault"
    with pytest.raises(hp.PlanInvariantError, match="view 'k_buffer'"):
        hp.check_plan(bad)


# --- spare rows, names ------------------------------------------------------------------------


def _state_view(plan: dict[str, Any], pool: str) -> dict[str, Any]:
    tensor = next(t for t in plan["tensors"] if t["pool"] == pool)
    view: dict[str, Any] = tensor["views"][0]
    return view


def test_spare_rows_past_every_page_are_taken() -> None:
    plan = tiny_plan("deepseek_v4")
    pools = {pool.name: pool for pool in plan.pools}
    for name in ("v4_state_c4", "v4_state_c128"):
        view = _state_view(tiny_dump("deepseek_v4"), name)
        pool = pools[name]
        assert view["shape"][0] > pool.num_blocks * (pool.block_tokens or 1)  # spare rows kept
    hp.check_plan(plan)


def test_spare_rows_inside_the_pages_are_refused() -> None:
    # One k_buffer row more: it is V's first row, which V's pages own.
    plan = tiny_dump("mha")
    plan["tensors"][0]["views"][0]["shape"][0] += 1
    assert view_faults(_validated(plan))
    with pytest.raises(hp.PlanInvariantError, match="meet the page at byte 1152"):
        hp.check_plan(plan)


def test_spare_rows_between_pages_are_taken_and_one_more_refused() -> None:
    """A window pool capped at 30 tokens of 4-token pages (the radix cache off): SGLang's
    K rows are 34, 2 past its 8 whole pages, in the half rounded up to 36 rows before V's;
    those 2 rows meet no page. A third reaches V's first page."""
    plan = tiny_dump("capped_window")
    swa = next(t for t in plan["tensors"] if t["pool"] == "swa")
    k, v = swa["views"]
    assert (k["shape"][0], v["storage_offset"] // (2 * 8)) == (34, 36)
    assert view_faults(_validated(plan)) == []
    hp.check_plan(plan)
    k["shape"][0] += 3
    assert view_faults(_validated(plan))
    with pytest.raises(hp.PlanInvariantError, match="meet the page at byte 1152"):
        hp.check_plan(plan)


def _tails_meeting() -> dict[str, Any]:
    """K and V of one page side by side (page-major views, a block apart) with a spare row each
    past the last page, in an allocation three blocks longer."""
    page, blocks = 64, 4
    view = {"dtype": "uint8", "strides": [2 * page, 1]}
    plan = tiny_dump("mha")
    pool = plan["pools"][0]
    pool.update(size=(blocks + 3) * 2 * page, num_blocks=blocks)
    plan["tensors"][0].update(
        size=pool["size"], block_stride=2 * page,
        ranges=[{"offset": 0, "size": page}, {"offset": page, "size": page}],
        views=[dict(view, name="k_buffer", shape=[blocks + 1, page], storage_offset=0),
               dict(view, name="v_buffer", shape=[blocks + 1, page], storage_offset=page)],
    )
    # The figures of three pages of four tokens, one request of the table's 16 tokens.
    plan.update(max_total_num_tokens=(blocks - 1) * plan["page_size"], max_running_requests=1)
    plan["req_to_token"].update(shape=[2, plan["req_to_token"]["shape"][1]])
    plan["capacity"]["max_concurrency"] = 12 / 16  # 12 tokens of 16-token requests
    plan["budget"]["cell_size_bytes"] = 2 * page * 2 // plan["page_size"]  # K + V, two layers
    return plan


def test_spare_rows_apart_are_taken_and_meeting_ones_refused() -> None:
    plan = _tails_meeting()
    assert view_faults(_validated(plan)) == []
    hp.check_plan(plan)
    # K's spare rows now reach past V's first one: their spans meet, so they are refused (the
    # proof takes each view's spare rows as one span, from its first spare byte to its end).
    plan["tensors"][0]["views"][0]["shape"][0] += 2
    with pytest.raises(hp.PlanInvariantError, match="spare rows apart"):
        hp.check_plan(plan)


def test_two_views_of_one_name_are_refused() -> None:
    plan = tiny_dump("mha")
    plan["tensors"][0]["views"][1]["name"] = "k_buffer"
    with pytest.raises(hp.PlanInvariantError, match=r"views \['k_buffer', 'k_buffer'\]"):
        hp.check_plan(plan)


def test_two_tensors_of_one_allocation_with_one_view_name_are_refused() -> None:
    # The conv states' tensor split in two, a layer each, both viewed as conv[0]: each tensor
    # carries SGLang's buffer, but one whole allocation then has two of it.
    plan = tiny_dump("mamba")
    whole = next(t for t in plan["tensors"] if t["pool"] == "mamba_conv0")
    second = copy.deepcopy(whole)
    for index, tensor in enumerate((whole, second)):
        tensor["layers"] = tensor["layers"][index:index + 1]
        tensor["offset"] = index * tensor["layer_stride"]
        view = tensor["views"][0]
        view["shape"][0] = 1
        view["storage_offset"] = index * view["strides"][0]
    plan["tensors"].append(second)
    with pytest.raises(hp.PlanInvariantError, match="unique view names"):
        hp.check_plan(plan)


# --- any single edit of a view ----------------------------------------------------------------

_FIELDS = ("shape", "strides", "storage_offset")


@st.composite
def _view_edits(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    """A tiny plan with one number of one view changed: nudged, doubled, halved, zeroed or
    replaced."""
    case = draw(st.sampled_from(list(TINY)))
    plan = copy.deepcopy(tiny_dump(case))
    tensors = [t for t in plan["tensors"] if t["views"]]
    view = draw(st.sampled_from(draw(st.sampled_from(tensors))["views"]))
    field = draw(st.sampled_from(_FIELDS))
    if field == "storage_offset":
        old = view[field]
    else:
        axis = draw(st.integers(0, len(view[field]) - 1))
        old = view[field][axis]
    new = draw(st.one_of(
        st.integers(max(old - 3, 0), old + 3), st.just(old * 2), st.just(old // 2),
        st.just(0), st.just(1), st.integers(0, 2 * old + 64),
    ))
    if field == "storage_offset":
        view[field] = new
    else:
        view[field][axis] = new
    return case, plan


@settings(max_examples=300)
@given(_view_edits())
def test_every_view_edit_check_plan_accepts_is_sound(edited: tuple[str, dict[str, Any]]) -> None:
    _, plan = edited
    try:
        hp.check_plan(plan)
    except hp.PlanInvariantError:
        return
    assert view_faults(_validated(plan)) == []
