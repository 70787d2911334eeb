"""Every figure an SGLang plan states is proved against the others or checked in range, and
every pool keeps its role whatever its name: edits the adversary found accepted (a NaN or
negative fraction, DeepSeek-V4 figures, a request table past int64, a per-layer pool on the
host, a renamed full pool) and their neighbours are refused, from the plan alone."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import ValidationError

import hisparse_plan as hp
from hisparse_plan.models.request import PlanRequest
from hisparse_plan.targets.sglang import plan_sglang
from hisparse_plan.targets.sglang.buffers import pool_buffers
from support.sglang_cases import TINY, tiny_dump, v4_request
from support.sglang_requests import mha, request, swa

Edit = Callable[[dict[str, Any]], None]


def _refused(case: str, edit: Edit, match: str | None = None) -> None:
    plan = tiny_dump(case)
    hp.check_plan(plan, request=TINY[case]())
    edit(plan)
    with pytest.raises(hp.PlanInvariantError, match=match):
        hp.check_plan(plan)


def _pool(plan: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(pool for pool in plan["pools"] if pool["name"] == name)
    return found


# --- budget.mem_fraction_static -----------------------------------------------------------------


@pytest.mark.parametrize("fraction", [math.nan, math.inf, -0.5, 0.0, 1.5])
def test_a_fraction_outside_zero_to_one_is_refused(fraction: float) -> None:
    plan = tiny_dump("mha")
    plan["budget"]["mem_fraction_static"] = fraction
    with pytest.raises(ValidationError, match="mem_fraction_static"):
        hp.check_plan(plan)


@pytest.mark.parametrize("fraction", [0.9, 1.0])
def test_a_fraction_in_range_is_taken(fraction: float) -> None:
    plan = tiny_dump("mha")
    plan["budget"]["mem_fraction_static"] = fraction
    hp.check_plan(plan)


# --- DeepSeek-V4's figures ----------------------------------------------------------------------


def _v4(field: str, delta: int | float) -> Edit:
    def edit(plan: dict[str, Any]) -> None:
        plan["deepseek_v4"][field] += delta

    return edit


def _v4_blocks(name: str) -> Edit:
    def edit(plan: dict[str, Any]) -> None:
        _pool(plan, name)["num_blocks"] -= 1

    return edit


def _v4_tokens_claimed(plan: dict[str, Any]) -> None:
    # The full tokens and their figure together: the window and compressed pools disagree.
    plan["max_total_num_tokens"] += 256
    plan["deepseek_v4"]["full_tokens"] += 256


@pytest.mark.parametrize("edit", [
    _v4("c4_tokens", 1), _v4("c128_tokens", 1), _v4("c4_index_tokens", 32),
    _v4("c4_state_rows", 4), _v4("c128_state_rows", 128), _v4("swa_tokens", 256),
    _v4("full_tokens", 256), _v4("swa_full_tokens_ratio", 0.25),
    _v4("bytes_per_full_token", 1.0), _v4("fixed_bytes", -1),
    _v4_blocks("v4_swa"), _v4_blocks("v4_c4"), _v4_blocks("v4_index_c4"),
    _v4_blocks("v4_c128"), _v4_blocks("v4_state_c4"), _v4_blocks("v4_state_c128"),
    _v4_tokens_claimed,
], ids=["c4_tokens", "c128_tokens", "c4_index_tokens", "c4_state_rows", "c128_state_rows",
        "swa_tokens", "full_tokens", "ratio", "coefficient", "fixed_bytes", "v4_swa_blocks",
        "v4_c4_blocks", "v4_index_c4_blocks", "v4_c128_blocks", "v4_state_c4_blocks",
        "v4_state_c128_blocks", "tokens_claimed"])
def test_deepseek_v4_figures_are_derived(edit: Edit) -> None:
    _refused("deepseek_v4", edit)


def test_deepseek_v4_pools_come_together() -> None:
    def drop_c128(plan: dict[str, Any]) -> None:
        plan["pools"] = [p for p in plan["pools"] if p["name"] != "v4_state_c128"]
        plan["tensors"] = [t for t in plan["tensors"] if t["pool"] != "v4_state_c128"]

    _refused("deepseek_v4", drop_c128, "all of them or none")


# --- the request-to-token table -----------------------------------------------------------------


def _table_width(width: int) -> Edit:
    def edit(plan: dict[str, Any]) -> None:
        table = plan["req_to_token"]
        table["shape"][1] = width
        table["strides"][0] = width

    return edit


def test_a_table_past_int64_bytes_is_refused() -> None:
    # rows x width x 4 bytes passes 2**63 - 1 while every field is a valid int64.
    rows = tiny_dump("mha")["req_to_token"]["shape"][0]
    width = 2**63 // (4 * rows) + 1
    assert rows * width * 4 > 2**63 - 1
    _refused("mha", _table_width(width), "int64")


def test_a_table_without_a_context_is_refused() -> None:
    _refused("mha", _table_width(4), "at least one token")


def test_a_table_wider_than_the_capacity_allows_is_refused() -> None:
    # Ten times the context: the stated concurrency claims more requests than the pool holds.
    width = tiny_dump("mha")["req_to_token"]["shape"][1]
    _refused("mha", _table_width((width - 4) * 10 + 4), "max_concurrency")


def _scaled_mha_page_1(tokens: int) -> dict[str, Any]:
    """The page-size-1 plan grown to `tokens` tokens: one layer of [tokens + 1, 2, 8] bf16 K
    then V, every figure following."""
    plan = tiny_dump("mha_page_1")
    rows, row = tokens + 1, 2 * 8
    half = rows * row
    pool = plan["pools"][0]
    pool.update(size=2 * half * 2, num_blocks=rows)
    tensor = plan["tensors"][0]
    tensor["size"] = pool["size"]
    tensor["ranges"][1]["offset"] = half * 2
    for view in tensor["views"]:
        view["shape"][0] = rows
    tensor["views"][1]["storage_offset"] = half
    plan["max_total_num_tokens"] = tokens
    plan["budget"]["available_bytes"] = tokens * plan["budget"]["cell_size_bytes"]
    plan["capacity"]["max_concurrency"] = float(plan["max_running_requests"])  # the fewest
    return plan


def test_token_ids_past_int32_are_refused() -> None:
    # The table's int32 entries hold ids 0 .. 2**31 - 1: the full pool's tokens and padding.
    hp.check_plan(_scaled_mha_page_1(2**31 - 1))
    with pytest.raises(hp.PlanInvariantError, match="int32"):
        hp.check_plan(_scaled_mha_page_1(2**31))


# --- pools keep their roles -----------------------------------------------------------------------


def _moved_to_host(name: str) -> Edit:
    def edit(plan: dict[str, Any]) -> None:
        _pool(plan, name)["location"] = "host"
        for tensor in plan["tensors"]:
            if tensor["pool"] == name:
                tensor["host_resident"] = True

    return edit


def _renamed(old: str, new: str) -> Edit:
    def edit(plan: dict[str, Any]) -> None:
        _pool(plan, old)["name"] = new
        for tensor in plan["tensors"]:
            if tensor["pool"] == old:
                tensor["pool"] = new

    return edit


def _renamed_and_tokens_claimed(plan: dict[str, Any]) -> None:
    _renamed("kv", "full")(plan)
    plan["max_total_num_tokens"] += plan["page_size"]


def _host_pool_per_layer(plan: dict[str, Any]) -> None:
    host = _pool(plan, "hisparse_host")
    host["allocation"] = "per_layer"
    for tensor in plan["tensors"]:
        if tensor["pool"] == "hisparse_host":
            tensor["layer_stride"] = 0


@pytest.mark.parametrize(("case", "edit", "match"), [
    ("mha", _moved_to_host("kv"), "expected device, per_layer"),
    ("dsa", _moved_to_host("index"), "expected device, per_layer"),
    ("mamba", _moved_to_host("mamba_conv0"), "expected device, whole"),
    ("deepseek_v4", _moved_to_host("v4_state_c4"), "expected device, per_layer"),
    ("dsa_hisparse", _host_pool_per_layer, "expected host, whole"),
    ("mha", _renamed("kv", "full"), "none of SGLang's pools"),
    ("mha", _renamed_and_tokens_claimed, "none of SGLang's pools"),
    ("mha", _renamed("kv", "swa"), "no pool 'kv'"),
    ("k_and_v_apart", _renamed("kv_v", "kv_w"), "none of SGLang's pools"),
    ("dsa", _renamed("index", "v4_c4"), "v4_c4"),
], ids=["kv_on_host", "index_on_host", "mamba_on_host", "v4_state_on_host",
        "host_pool_per_layer", "kv_renamed", "kv_renamed_more_tokens", "kv_named_swa",
        "v_renamed", "index_named_v4"])
def test_pools_keep_their_roles_whatever_their_names(case: str, edit: Edit, match: str) -> None:
    _refused(case, edit, match)


def test_the_host_pool_comes_exactly_with_hisparse() -> None:
    def no_hisparse(plan: dict[str, Any]) -> None:
        plan["hisparse"] = None
        plan["capacity"]["steady_state_concurrency"] = None

    _refused("dsa_hisparse", no_hisparse, "exactly with HiSparse")


# --- figures beside the full pool -----------------------------------------------------------------


def _blocks(name: str, delta: int) -> Edit:
    def edit(plan: dict[str, Any]) -> None:
        _pool(plan, name)["num_blocks"] += delta

    return edit


def _more_requests(plan: dict[str, Any]) -> None:
    # Every figure of the table follows; the full pool holds two tokens a request at most.
    requests = plan["max_total_num_tokens"] // 2 + 1
    plan["max_running_requests"] = requests
    plan["req_to_token"]["shape"][0] = requests + 1


def _host_tokens_padded(plan: dict[str, Any]) -> None:
    plan["hisparse"]["host_tokens"] += plan["page_size"]
    _pool(plan, "hisparse_host")["num_blocks"] += 1


def _steady_state_claimed(plan: dict[str, Any]) -> None:
    plan["capacity"]["steady_state_concurrency"] = plan["max_running_requests"] + 1.0


def _concurrency(factor: float) -> Edit:
    def edit(plan: dict[str, Any]) -> None:
        plan["capacity"]["max_concurrency"] *= factor

    return edit


def _steady_state_lowered(plan: dict[str, Any]) -> None:
    plan["capacity"]["steady_state_concurrency"] /= 2


def _second_stage(plan: dict[str, Any]) -> None:
    plan["pools"][-1]["stage"] = 1


@pytest.mark.parametrize(("case", "edit"), [
    ("k_and_v_apart", _blocks("kv_v", -1)),
    # Two pages fewer: one fewer is within the ratio's float slack (and its K rows past the
    # last page, before V's, are sound spare rows).
    ("window", _blocks("swa", -2)),
    ("dsa", _blocks("index", -1)),
    ("dsa_hisparse", _blocks("index", -1)),
    ("mamba", _blocks("mamba_temporal", -1)),
    ("mha", _more_requests),
    ("dsa_hisparse", _host_tokens_padded),
    ("dsa_hisparse", _steady_state_claimed),
    ("dsa_hisparse", _steady_state_lowered),
    ("mha", _concurrency(1.5)),
    ("mha", _concurrency(0.5)),
    ("mamba", _concurrency(0.5)),
    ("window", _concurrency(10)),  # past the full pool's bound: the window's is not stated
    ("deepseek_v4", _concurrency(1.5)),
    ("mamba", _second_stage),
    ("deepseek_v4", _second_stage),
], ids=["v_blocks", "window_v_blocks", "index_pages", "hisparse_index_pages",
        "mamba_slots", "requests_past_half_the_tokens", "host_tokens", "steady_state",
        "steady_state_lowered", "concurrency_claimed", "concurrency_lowered",
        "mamba_concurrency_lowered", "window_concurrency_claimed", "v4_concurrency_claimed",
        "mamba_second_stage", "v4_second_stage"])
def test_figures_beside_the_full_pool_are_derived(case: str, edit: Edit) -> None:
    _refused(case, edit)


def test_mamba_slots_bound_the_running_requests() -> None:
    def more(plan: dict[str, Any]) -> None:
        plan["max_running_requests"] += 1
        plan["req_to_token"]["shape"][0] += 1

    _refused("mamba", more, "Mamba state slots")


def _cell(factor: float) -> Edit:
    def edit(plan: dict[str, Any]) -> None:
        plan["budget"]["cell_size_bytes"] *= factor

    return edit


@pytest.mark.parametrize(("case", "factor"), [
    *((case, factor) for case in ("mha", "k_and_v_apart", "dsa", "dsa_hisparse", "mamba")
      for factor in (0.5, 1.5)),
    ("window", 0.5),  # a window pool adds its ratio of a token, which the plan does not state
])
def test_the_cell_size_is_the_counted_pools_bytes_a_token(case: str, factor: float) -> None:
    _refused(case, _cell(factor), "cell_size_bytes")


# --- the fuzzer's findings (references/fuzz_plan_edits.py): each edit was accepted ---------------


def _tensor(plan: dict[str, Any], pool: str) -> dict[str, Any]:
    found: dict[str, Any] = next(t for t in plan["tensors"] if t["pool"] == pool)
    return found


def _view_named(pool: str, index: int, name: str) -> Edit:
    def edit(plan: dict[str, Any]) -> None:
        _tensor(plan, pool)["views"][index]["name"] = name

    return edit


def _views_dropped(pool: str) -> Edit:
    def edit(plan: dict[str, Any]) -> None:
        tensor = _tensor(plan, pool)
        tensor["views"] = []

    return edit


def _k_and_v_swapped(plan: dict[str, Any]) -> None:
    views = _tensor(plan, "kv")["views"]
    views[0]["name"], views[1]["name"] = views[1]["name"], views[0]["name"]


@pytest.mark.parametrize(("case", "edit"), [
    ("mha", _view_named("kv", 1, "swa")),
    ("mha", _view_named("kv", 0, "kv")),
    ("mha", _k_and_v_swapped),
    ("window", _view_named("swa", 0, "per_layer")),
    ("k_and_v_apart", _view_named("kv", 0, "kv_buffer")),
    ("k_and_v_apart", _views_dropped("kv")),
    ("dsa", _views_dropped("index")),
    ("dsa", _view_named("index", 0, "kv_buffer")),
    ("dsa_hisparse", _view_named("hisparse_host", 0, "kv_buffer")),
    ("mamba", _view_named("mamba_conv0", 0, "temporal")),
    ("deepseek_v4", _view_named("v4_state_c4", 0, "kv_buffer")),
    ("deepseek_v4", _view_named("v4_swa", 0, "index_k")),
], ids=["v_named_swa", "k_named_kv", "k_and_v_swapped", "window_k_renamed",
        "k_apart_named_latent", "k_apart_unviewed", "index_unviewed", "index_named_latent",
        "host_named_latent", "conv_named_temporal", "v4_state_named_latent",
        "v4_window_named_index"])
def test_tensors_carry_exactly_the_buffers_sglang_keeps(case: str, edit: Edit) -> None:
    _refused(case, edit, "buffers SGLang keeps")


def test_the_buffer_table_names_what_the_planner_builds() -> None:
    # Every pool of every tiny plan carries one of its table entries, in range order.
    for case in TINY:
        plan = tiny_dump(case)
        pools = {pool["name"] for pool in plan["pools"]}
        for tensor in plan["tensors"]:
            names = tuple(view["name"] for view in tensor["views"])
            assert names in pool_buffers(tensor["pool"], pools), (case, tensor["pool"])


def _shared(name: str) -> Edit:
    def edit(plan: dict[str, Any]) -> None:
        _pool(plan, name)["shared"] = True

    return edit


@pytest.mark.parametrize(("case", "pool"), [
    ("mha", "kv"), ("dsa_hisparse", "index"), ("mamba", "mamba_temporal"),
    ("deepseek_v4", "v4_state_c128"),
])
def test_a_device_pool_is_never_shared(case: str, pool: str) -> None:
    _refused(case, _shared(pool), "only a host pool is shared")


def test_the_host_pool_may_be_shared() -> None:
    plan = tiny_dump("dsa_hisparse")
    _shared("hisparse_host")(plan)
    hp.check_plan(plan)


def _layer_renamed(pool: str, position: int, name: str) -> Edit:
    def edit(plan: dict[str, Any]) -> None:
        _tensor(plan, pool)["layers"][position] = name

    return edit


@pytest.mark.parametrize(("case", "edit"), [
    ("k_and_v_apart", _layer_renamed("kv_v", 0, "b")),
    ("k_and_v_apart", _layer_renamed("kv", 0, "b")),
    ("mamba", _layer_renamed("mamba_temporal", 0, "a1")),
    ("mamba", _layer_renamed("mamba_conv0", 1, "m9")),
    ("dsa_hisparse", _layer_renamed("hisparse_host", 1, "l9.attn")),
], ids=["v_of_another_layer", "k_of_another_layer", "temporal_of_another_layer",
        "conv_of_another_layer", "host_rows_of_another_layer"])
def test_pools_of_one_layer_hold_the_same_layers(case: str, edit: Edit) -> None:
    _refused(case, edit, "expected the same layers")


def _pool_emptied(pool: str) -> Edit:
    def edit(plan: dict[str, Any]) -> None:
        plan["tensors"] = [t for t in plan["tensors"] if t["pool"] != pool]

    return edit


@pytest.mark.parametrize(("case", "pool"), [
    ("dsa_hisparse", "hisparse_host"), ("mamba", "mamba_temporal"), ("window", "kv"),
    ("deepseek_v4", "v4_index_c4"),
])
def test_every_pool_holds_a_layer(case: str, pool: str) -> None:
    _refused(case, _pool_emptied(pool), "holds no layer")


def test_a_tensor_listing_a_layer_twice_is_refused() -> None:
    # Both Mamba layers' conv states become the first layer's: the view still has two layers.
    _refused("mamba", _layer_renamed("mamba_conv0", 1, "m0"), "twice by tensors")


@pytest.mark.parametrize("cell", [95.0, 90.0, 64.5])
def test_the_window_ratio_the_cell_gives_must_give_the_window_tokens(cell: float) -> None:
    # full 64 + ratio 0.5 x window 64 bytes a token = 96; swa holds int(64 x 0.5) = 32 tokens.
    # A smaller cell gives a smaller ratio, and fewer tokens than the pool holds.
    def edit(plan: dict[str, Any]) -> None:
        plan["budget"]["cell_size_bytes"] = cell

    _refused("window", edit, "counts the window pool at")


def test_a_cell_giving_the_same_window_tokens_is_taken() -> None:
    # 97 bytes: ratio 33/64, int(64 x 33/64) = 33 tokens, floored to the 4-token page: 32.
    plan = tiny_dump("window")
    plan["budget"]["cell_size_bytes"] = 97.0
    hp.check_plan(plan)


def _v4_swa_layer_dropped(plan: dict[str, Any]) -> None:
    _tensor(plan, "v4_swa")["layers"].pop(0)


def test_the_v4_coefficient_is_the_pools_bytes_a_full_token() -> None:
    _refused("deepseek_v4", _v4_swa_layer_dropped, "bytes_per_full_token")


def _v4_ring_bytes() -> int:
    """One request slot's 128-row ring of the c128 states (one layer of float32 rows)."""
    plan = tiny_dump("deepseek_v4")
    rows: int = plan["deepseek_v4"]["c128_state_rows"]
    state: int = _pool(plan, "v4_state_c128")["size"]
    return state * 128 // rows


@pytest.mark.parametrize("delta", [210, 1, None])
def test_the_set_aside_is_whole_rings_for_the_running_requests(delta: int | None) -> None:
    # Uncapped (one running request of 512 allowed), the set-aside is the plan's own states:
    # neither a few bytes more nor one ring (None) more.
    step = _v4_ring_bytes() if delta is None else delta
    _refused("deepseek_v4", _v4("fixed_bytes", step), "fixed_bytes")


def test_a_capped_plan_sets_aside_rings_for_the_requested_requests() -> None:
    # 600 requested, capped at 1024 // 2 = 512 running: the planner sets aside 603 rings,
    # the states hold 515; whole rings more are the figure of a larger request, a byte more
    # is no figure.
    data = v4_request(max_running_requests=600).model_dump(mode="json")
    data["device"]["available_bytes"] = 2**30
    plan = plan_sglang(PlanRequest.model_validate(data)).model_dump(mode="json")
    assert plan["max_running_requests"] == plan["max_total_num_tokens"] // 2 == 512
    ring = _pool(plan, "v4_state_c128")["size"] * 128 // plan["deepseek_v4"]["c128_state_rows"]
    assert plan["deepseek_v4"]["fixed_bytes"] == 603 * ring
    hp.check_plan(plan)
    plan["deepseek_v4"]["fixed_bytes"] -= ring  # 599 requested: still capped at 512
    hp.check_plan(plan)
    plan["deepseek_v4"]["fixed_bytes"] += 1
    with pytest.raises(hp.PlanInvariantError, match="fixed_bytes"):
        hp.check_plan(plan)


def _window_v_apart() -> tuple[PlanRequest, dict[str, Any]]:
    """A window layer whose V heads are half its K heads: SGLang keeps them in swa_v."""
    window = swa(16, heads=2, head=8)
    window["head_size_v"] = 4
    asked = request({"w0": window, "f1": mha(heads=2, head=8)}, page_size=4,
                    max_total_tokens=64, swa_full_tokens_ratio=0.5, context_length=16)
    return asked, plan_sglang(asked).model_dump(mode="json")


@pytest.mark.parametrize(("edit", "why"), [
    (_view_named("swa", 0, "v_buffer"), "buffers SGLang keeps"),
    (_layer_renamed("swa_v", 0, "f1"), "expected the same layers"),
    (_shared("swa_v"), "only a host pool is shared"),
], ids=["k_named_v", "v_of_another_layer", "shared"])
def test_a_window_pool_with_v_apart_keeps_its_roles(edit: Edit, why: str) -> None:
    asked, plan = _window_v_apart()
    assert [t["pool"] for t in plan["tensors"]] == ["kv", "swa", "swa_v"]
    hp.check_plan(plan, request=asked)
    edit(plan)
    with pytest.raises(hp.PlanInvariantError, match=why):
        hp.check_plan(plan)
