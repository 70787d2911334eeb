"""Plan-edit fuzzing: random single edits of the planner's own plans (both engines), each edit
check_plan accepts judged sound by an oracle of independent arithmetic (plan_edit_oracle_*), and
refused by check_plan given the request when it changes the plan. Then the oracle itself, on tiny
hand-written plans, so that it cannot pass vacuously. references/fuzz_plan_edits.py runs the
same fuzzer at 20,000+ edits."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from hisparse_plan.models import KVCachePlan
from hisparse_plan.models.request import PlanRequest
from hisparse_plan.models.sglang_plan import SGLangPlan
from hisparse_plan.targets.sglang import plan_sglang
from support.plan_edit_bytes import first_overlap, row_runs
from support.plan_edit_fuzz import report, run
from support.plan_edit_oracle_sglang import sglang_faults
from support.plan_edit_oracle_vllm import vllm_faults
from support.sglang_cases import tiny_dump, v4_request
from support.sglang_requests import mha, request, swa

EDITS = 1500


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_every_accepted_edit_is_sound(engine: str) -> None:
    tally = run(engine, seed=0, edits=EDITS)
    outcomes = tally.outcomes
    assert tally.seeds >= 10
    assert outcomes["tried"] == EDITS
    # Not vacuous: edits reach check_plan, some are refused and some accepted.
    assert outcomes["refused"] > EDITS // 10
    assert outcomes["accepted sound"] + outcomes["ACCEPTED UNSOUND"] > 0
    assert tally.failures == 0, report(tally)


# --- the oracle on hand-written plans --------------------------------------------------------


def tiny_sglang() -> dict[str, Any]:
    """One MHA layer of 1 head of 4 bf16 elements, pages of 2 tokens, 2 pages and the padding
    page: K rows [0, 48), V rows [48, 96) of a 96-byte buffer."""
    return {
        "engine": "sglang",
        "pools": [{"name": "kv", "location": "device", "allocation": "per_layer", "size": 96,
                   "num_blocks": 3, "block_tokens": 2, "padding_blocks": 1}],
        "tensors": [{
            "size": 96, "layers": ["a"], "layer_stride": 0, "block_stride": 16, "offset": 0,
            "host_resident": False, "pool": "kv",
            "ranges": [{"offset": 0, "size": 16}, {"offset": 48, "size": 16}],
            "views": [
                {"name": "k_buffer", "dtype": "bfloat16", "shape": [6, 1, 4],
                 "strides": [4, 4, 1], "storage_offset": 0},
                {"name": "v_buffer", "dtype": "bfloat16", "shape": [6, 1, 4],
                 "strides": [4, 4, 1], "storage_offset": 24},
            ],
        }],
        "page_size": 2,
        "max_total_num_tokens": 4,
        "max_running_requests": 2,
        "req_to_token": {"name": "req_to_token", "dtype": "int32", "shape": [3, 8],
                         "strides": [8, 1], "storage_offset": 0},
        "budget": {"available_bytes": 64, "cell_size_bytes": 16, "mem_fraction_static": None},
        "capacity": {"max_concurrency": 1.0, "steady_state_concurrency": None},
    }


def tiny_vllm() -> dict[str, Any]:
    """Two groups of one full-attention layer each (1 head, head size 2, float32, 2-token
    blocks: 32-byte pages) overlaying a BLNHC pool of 5 blocks of 64 bytes, both from byte 0:
    each page in the first half of its block."""
    spec = {"kind": "full_attention", "block_size": 2, "num_kv_heads": 1, "head_size": 2,
            "dtype": "float32"}
    return {
        "pools": [{"name": "device", "location": "device", "allocation": "whole", "size": 320,
                   "num_blocks": 5, "block_tokens": None, "padding_blocks": 1}],
        "num_blocks": 5,
        "groups": [{"layer_names": [name], "spec": spec, "role": "default",
                    "host_resident": False, "enable_kv_transfer": True} for name in "ab"],
        "tensors": [{"size": 320, "layers": [name], "layer_stride": 32, "block_stride": 64,
                     "offset": 0, "host_resident": False, "pool": "device"} for name in "ab"],
        "host_pool": None,
        "capacity": {"max_concurrency": 1.25, "steady_state_concurrency": None},
        "device_pools": [{"layout": "BLNHC", "bytes_per_block": 64, "size": 320,
                          "available_bytes": 320, "num_blocks_override": None}],
        "workload": {"max_model_len": 4, "max_num_batched_tokens": 4,
                     "max_concurrent_batches": 1},
    }


def sglang_kinds(plan: dict[str, Any]) -> list[str]:
    return [fault.kind for fault in sglang_faults(SGLangPlan.model_validate(plan))]


def vllm_kinds(plan: dict[str, Any]) -> list[str]:
    return [fault.kind for fault in vllm_faults(KVCachePlan.model_validate(plan))]


def edited(base: dict[str, Any], change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    plan = copy.deepcopy(base)
    change(plan)
    return plan


def test_hand_written_plans_are_sound() -> None:
    assert sglang_kinds(tiny_sglang()) == []
    assert vllm_kinds(tiny_vllm()) == []


def _tensor(plan: dict[str, Any]) -> dict[str, Any]:
    tensor: dict[str, Any] = plan["tensors"][0]
    return tensor


def _view(plan: dict[str, Any], index: int) -> dict[str, Any]:
    view: dict[str, Any] = _tensor(plan)["views"][index]
    return view


def _resize(plan: dict[str, Any], size: int) -> None:
    plan["pools"][0]["size"] = size
    _tensor(plan)["size"] = size


def _spare_tail(plan: dict[str, Any]) -> None:
    """32 bytes past every page: room for 2 spare V rows."""
    _resize(plan, 128)
    _view(plan, 1)["shape"] = [8, 1, 4]


def _late_v_buffer(plan: dict[str, Any]) -> None:
    """v_buffer a page (2 rows) late: its rows over the next block's V page, its last rows in
    the spare tail (no two elements share a byte, nothing leaves the buffer)."""
    _spare_tail(plan)
    _view(plan, 1)["storage_offset"] = 32


def _renamed_kv(plan: dict[str, Any]) -> None:
    plan["pools"][0]["name"] = "kv2"
    _tensor(plan)["pool"] = "kv2"


SGLANG_FAULTS: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("pages of blocks 0 and 1 overlap",
     lambda p: _tensor(p).update(block_stride=8), "page overlap"),
    ("the last V page past the buffer", lambda p: _resize(p, 80), "page out of bounds"),
    ("rows of k_buffer overlap", lambda p: _view(p, 0).update(strides=[2, 4, 1]),
     "view aliasing"),
    ("k_buffer's last rows are v_buffer's first",
     lambda p: _view(p, 1).update(storage_offset=20), "view aliasing"),
    ("a head axis of stride 0", lambda p: _view(p, 0).update(shape=[6, 2, 2],
                                                           strides=[4, 0, 1]), "view aliasing"),
    ("v_buffer past the buffer", lambda p: _view(p, 1).update(storage_offset=25),
     "view out of bounds"),
    ("v_buffer one page late, its last rows in the spare tail", _late_v_buffer,
     "view misplaced"),
    ("v_buffer without its last page", lambda p: _view(p, 1).update(shape=[4, 1, 4]),
     "page not viewed"),
    ("two views named k_buffer", lambda p: _view(p, 1).update(name="k_buffer"), "view names"),
    ("kv holds 4 tokens, the plan says 6",
     lambda p: p.update(max_total_num_tokens=6), "max_total_num_tokens"),
    ("the kv pool renamed", _renamed_kv, "pool role"),
    ("a per-layer pool on the host", lambda p: p["pools"][0].update(location="host"),
     "pool location"),
    ("a request table past int64",
     lambda p: p.update(max_running_requests=2**61, req_to_token={
         "name": "req_to_token", "dtype": "int32", "shape": [2**61 + 1, 8], "strides": [8, 1],
         "storage_offset": 0}), "req_to_token"),
    ("capacity of 2 for 4 tokens of 4-token requests",
     lambda p: p["capacity"].update(max_concurrency=2.0), "capacity"),
]


@pytest.mark.parametrize(("change", "kind"), [(c, k) for _, c, k in SGLANG_FAULTS],
                         ids=[what for what, _, _ in SGLANG_FAULTS])
def test_sglang_oracle_finds(change: Callable[[dict[str, Any]], None], kind: str) -> None:
    assert kind in sglang_kinds(edited(tiny_sglang(), change))


@pytest.mark.parametrize("fraction", [float("nan"), 1.5, 0.0])
def test_sglang_oracle_finds_a_fraction_out_of_range(fraction: float) -> None:
    # Validation refuses these first; the oracle refuses them on its own (a copy skips it).
    plan = SGLangPlan.model_validate(tiny_sglang())
    budget = plan.budget.model_copy(update={"mem_fraction_static": fraction})
    faults = sglang_faults(plan.model_copy(update={"budget": budget}))
    assert "mem_fraction_static" in [fault.kind for fault in faults]


def test_sglang_fraction_one_is_sound() -> None:
    # SGLang 0.5.23 checks no range, and its own rule rounds to 1.0 on a large enough GPU.
    assert sglang_kinds(edited(tiny_sglang(),
                               lambda p: p["budget"].update(mem_fraction_static=1.0))) == []


def test_sglang_spare_rows_in_the_tail_are_sound() -> None:
    assert sglang_kinds(edited(tiny_sglang(), _spare_tail)) == []


def test_sglang_spare_rows_between_pages_are_sound_and_one_more_is_not() -> None:
    """A window pool capped at 30 tokens of 4-token pages: K's 2 rows past its last whole page
    lie before V's first page, on no page; a third K row would be V's first row."""
    plan = tiny_dump("capped_window")
    assert sglang_kinds(plan) == []
    swa = next(t for t in plan["tensors"] if t["pool"] == "swa")
    swa["views"][0]["shape"][0] += 3
    assert "view aliasing" in sglang_kinds(plan)


def _second(plan: dict[str, Any]) -> dict[str, Any]:
    tensor: dict[str, Any] = plan["tensors"][1]
    return tensor


def _one_group(plan: dict[str, Any]) -> None:
    """Both layers in one group (one block table: 2 blocks a request of the 5)."""
    plan["groups"] = [dict(plan["groups"][0], layer_names=["a", "b"])]
    plan["capacity"]["max_concurrency"] = 2.5


VLLM_FAULTS: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("group b's block 3 over group a's block 2",
     lambda p: _second(p).update(block_stride=48), "page overlap"),
    ("two layers of one group on the same bytes", _one_group, "page overlap"),
    ("group b's last page past the pool", lambda p: _second(p).update(offset=40),
     "page out of bounds"),
    ("a float32 page at an odd byte", lambda p: _second(p).update(offset=2), "alignment"),
    ("capacity of 2 for 4 blocks a request in 5",
     lambda p: p["capacity"].update(max_concurrency=2.0), "capacity"),
    ("num_blocks 5 of 64-byte blocks in 256 bytes",
     lambda p: p["device_pools"][0].update(available_bytes=256), "num_blocks"),
    ("the one stage lists a layer twice",
     lambda p: p["device_pools"][0].update(layers=["a", "a", "b"]), "stage layers"),
    ("the one stage lists a layer of no group",
     lambda p: p["device_pools"][0].update(layers=["a", "b", "c"]), "stage layers"),
]


@pytest.mark.parametrize(("change", "kind"), [(c, k) for _, c, k in VLLM_FAULTS],
                         ids=[what for what, _, _ in VLLM_FAULTS])
def test_vllm_oracle_finds(change: Callable[[dict[str, Any]], None], kind: str) -> None:
    assert kind in vllm_kinds(edited(tiny_vllm(), change))


def test_vllm_one_stage_may_list_its_layers() -> None:
    """device.pipeline_stages of one entry: the planner's plan lists the stage's layers."""
    assert vllm_kinds(edited(tiny_vllm(),
                             lambda p: p["device_pools"][0].update(layers=["a", "b"]))) == []


def test_sglang_window_v_apart_is_sound() -> None:
    """A window layer whose V heads differ from its K heads: the planner keeps V in swa_v."""
    window = swa(16, heads=2, head=8)
    window["head_size_v"] = 4
    plan = plan_sglang(request({"w0": window, "f1": mha(heads=2, head=8)}, page_size=4,
                               max_total_tokens=64, swa_full_tokens_ratio=0.5,
                               context_length=16))
    assert "swa_v" in {pool.name for pool in plan.pools}
    assert sglang_faults(plan) == []


def test_sglang_capped_requests_set_aside_more_rings() -> None:
    """DeepSeek-V4 with 600 running requests asked and 512 allowed (full // 2): the planner's
    set-aside is 603 rings of the c128 states, the states 515; sound, and a byte more is not."""
    data = v4_request(max_running_requests=600).model_dump(mode="json")
    data["device"]["available_bytes"] = 2**30
    plan = plan_sglang(PlanRequest.model_validate(data))
    assert plan.max_running_requests == 512
    assert plan.deepseek_v4 is not None
    assert sglang_faults(plan) == []
    more = plan.deepseek_v4.fixed_bytes + 1
    figures = plan.deepseek_v4.model_copy(update={"fixed_bytes": more})
    faults = sglang_faults(plan.model_copy(update={"deepseek_v4": figures}))
    kinds = [fault.kind for fault in faults]
    assert "deepseek_v4 fixed_bytes" in kinds


def test_vllm_groups_may_overlay_the_same_block() -> None:
    """Group b half a page later overlaps group a's page of the same block only: sound (a
    block id belongs to one group at a time)."""
    assert vllm_kinds(edited(tiny_vllm(), lambda p: _second(p).update(offset=16))) == []


def test_runs_enumerate_every_element() -> None:
    """A transposed [2, 3] int16 view: 6 elements, 6 distinct addresses, none folded wrongly;
    a stride-0 axis repeats an address."""
    starts, run = row_runs([1, 2, 3], [0, 1, 2], 0, 2, 1)
    addresses = sorted(int(s) + k for s in starts.ravel() for k in range(0, run, 2))
    assert addresses == [0, 2, 4, 6, 8, 10]
    starts, run = row_runs([1, 2, 3], [0, 3, 0], 0, 2, 1)
    assert first_overlap(starts.ravel(), starts.ravel() + run) is not None
