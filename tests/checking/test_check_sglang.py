"""check_plan on SGLang plans: every plan the SGLang target makes is proved, and tampering with
its bytes or its meaning is refused (from the plan alone, and against its request)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import hisparse_plan as hp
from hisparse_plan.models.request import PlanRequest
from hisparse_plan.models.sglang_plan import SGLangPlan
from support.sglang_cases import v4_request
from support.sglang_requests import dsa_layers, golden, mha, request, swa

Tamper = Callable[[dict[str, Any]], None]
GIB = 2**30
WINDOW_DRAFT: dict[str, Any] = {
    "speculative_algorithm": "EAGLE", "speculative_draft_num_layers": 4,
    "speculative_draft_window_layers": 2, "speculative_draft_window_layer_ids": [1, 3]}

CASES: dict[str, Callable[[], PlanRequest]] = {
    "llama": lambda: request({f"l{i}": mha() for i in range(4)}, available=2 * GIB,
                             page_size=16),
    "window": lambda: request({f"l{i}": (swa(128) if i % 2 else mha()) for i in range(4)},
                              available=2 * GIB, page_size=16),
    "dsa": lambda: request(dsa_layers(3), available=2 * GIB),
    # A window model drafting with its own layers (SGLang 0.5.23 builds a hybrid-window draft
    # pool: draft_kv and draft_swa), with the radix cache on and off.
    "window_draft": lambda: request(
        {f"l{i}": (swa(128) if i % 2 else mha()) for i in range(4)}, available=2 * GIB,
        page_size=16, **WINDOW_DRAFT),
    "window_draft_radix_off": lambda: request(
        {f"l{i}": (swa(128) if i % 2 else mha()) for i in range(4)}, available=2 * GIB,
        page_size=16, disable_radix_cache=True, max_running_requests=8, **WINDOW_DRAFT),
    "dsa_hisparse": lambda: request(dsa_layers(3), available=2 * GIB, enable_hisparse=True),
    # HiSparse with MTP: the coordinator's speculative swap tables join hisparse.metadata.
    "dsa_hisparse_mtp": lambda: request(dsa_layers(3), available=2 * GIB, enable_hisparse=True,
                                        speculative_algorithm="NEXTN",
                                        speculative_draft_num_layers=1),
    "qwen3_next": lambda: golden("regular_qwen3_next_80b_mamba", context_length=8192),
    "deepseek_v4_rank": lambda: v4_request(6, pp_size=2, pp_rank=1),
    "deepseek_v4_hisparse_rank": lambda: v4_request(
        6, pp_size=2, pp_rank=0, enable_hisparse=True, hisparse_host_to_device_ratio=2),
}


def planned(case: str) -> tuple[PlanRequest, dict[str, Any]]:
    req = CASES[case]()
    plan = hp.plan_for_engine(req)
    assert isinstance(plan, SGLangPlan)
    return req, plan.model_dump(mode="json")


def _block_stride_halved(plan: dict[str, Any]) -> None:
    plan["tensors"][0]["block_stride"] //= 2


def _second_range_moved(plan: dict[str, Any]) -> None:
    ranges = plan["tensors"][0]["ranges"]
    ranges[-1]["offset"] += 64 if len(ranges) > 1 else 0
    if len(ranges) == 1:
        plan["tensors"][0]["offset"] = plan["pools"][0]["size"]


def _pool_shrunk(plan: dict[str, Any]) -> None:
    plan["pools"][0]["size"] -= 4096
    for tensor in plan["tensors"]:
        if tensor["pool"] == plan["pools"][0]["name"]:
            tensor["size"] = plan["pools"][0]["size"]


BYTE_TAMPERS = [_block_stride_halved, _second_range_moved, _pool_shrunk]


@pytest.mark.parametrize("tamper", BYTE_TAMPERS)
@pytest.mark.parametrize("case", list(CASES))
def test_byte_tampers_are_refused(case: str, tamper: Tamper) -> None:
    req, plan = planned(case)
    hp.check_plan(plan, request=req)
    tamper(plan)
    with pytest.raises(hp.PlanInvariantError):
        hp.check_plan(plan)


def _more_requests(plan: dict[str, Any]) -> None:
    plan["max_running_requests"] += 1


def _table_one_row_short(plan: dict[str, Any]) -> None:
    plan["req_to_token"]["shape"][0] -= 1


def _tokens_claimed(plan: dict[str, Any]) -> None:
    plan["max_total_num_tokens"] += plan["page_size"]


def _view_moved(plan: dict[str, Any]) -> None:
    plan["tensors"][0]["views"][0]["strides"][0] *= 2


def _view_dtype(plan: dict[str, Any]) -> None:
    view = plan["tensors"][0]["views"][0]
    view["dtype"] = "float32" if view["dtype"] != "float32" else "bfloat16"


def _no_padding_page(plan: dict[str, Any]) -> None:
    plan["pools"][0]["padding_blocks"] = 0


def _capacity_inflated(plan: dict[str, Any]) -> None:
    plan["capacity"]["max_concurrency"] = plan["max_running_requests"] + 1


MEANING_TAMPERS = [_more_requests, _table_one_row_short, _tokens_claimed, _view_moved,
                   _view_dtype, _no_padding_page, _capacity_inflated]


@pytest.mark.parametrize("tamper", MEANING_TAMPERS)
@pytest.mark.parametrize("case", list(CASES))
def test_meaning_tampers_are_refused(case: str, tamper: Tamper) -> None:
    req, plan = planned(case)
    tamper(plan)
    with pytest.raises(hp.PlanInvariantError):
        hp.check_plan(plan, request=req)
    with pytest.raises(hp.PlanInvariantError):
        hp.check_plan(plan)


def _hot_rows(plan: dict[str, Any]) -> None:
    plan["hisparse"]["hot_rows_per_request"] -= 1


def _host_tokens(plan: dict[str, Any]) -> None:
    plan["hisparse"]["host_tokens"] -= plan["page_size"]


@pytest.mark.parametrize("tamper", [_hot_rows, _host_tokens])
def test_hisparse_figures_must_agree(tamper: Tamper) -> None:
    _, plan = planned("dsa_hisparse")
    tamper(plan)
    with pytest.raises(hp.PlanInvariantError, match="hisparse"):
        hp.check_plan(plan)


def test_a_sound_plan_for_another_request_is_refused_against_it() -> None:
    _, plan = planned("llama")
    other = CASES["window"]()
    hp.check_plan(plan)
    with pytest.raises(hp.PlanInvariantError, match="the request gives"):
        hp.check_plan(plan, request=other)
