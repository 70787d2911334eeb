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
from sglang_cases import TINY, tiny_dump

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
    ("window", _blocks("swa", -1)),
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
