"""Plan contract 2's pool invariants: a vLLM plan's `pools` agree with its pools, and pages made
of explicit ranges (SGLang's K and V halves) stay inside their allocation and apart."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

import hisparse_plan as hp
from hisparse_plan.models.sglang_plan import SGLangPlan
from support.golden import load
from support.sglang_hand_plans import HALF, mha_plan

Tamper = Callable[[dict[str, Any]], None]



def vllm_plan(case: str = "glm5_fp8_blhnc") -> dict[str, Any]:
    return hp.plan(load(case)[0]).model_dump(mode="json")


def _renamed(plan: dict[str, Any]) -> None:
    plan["pools"][-1]["name"] = "gpu"


def _pool_size(plan: dict[str, Any]) -> None:
    plan["pools"][-1]["size"] += 4096


def _pool_blocks(plan: dict[str, Any]) -> None:
    plan["pools"][-1]["num_blocks"] -= 1


def _no_null_block(plan: dict[str, Any]) -> None:
    plan["pools"][-1]["padding_blocks"] = 0


def _device_tensor_in_host_pool(plan: dict[str, Any]) -> None:
    plan["tensors"][-1]["pool"] = "host"


def _ranges_on_a_vllm_tensor(plan: dict[str, Any]) -> None:
    plan["tensors"][-1]["ranges"] = [{"offset": 0, "size": 64}]


@pytest.mark.parametrize(("tamper", "message"), [
    (_renamed, "pools are named|names pool .device."),
    (_pool_size, "has size"),
    (_pool_blocks, "has num_blocks"),
    (_no_null_block, "has padding_blocks"),
    (_device_tensor_in_host_pool, "host_resident|names pool"),
    (_ranges_on_a_vllm_tensor, "explicit ranges"),
])
def test_a_vllm_plans_pools_must_be_its_pools(tamper: Tamper, message: str) -> None:
    plan = vllm_plan()
    hp.check_plan(plan)
    tamper(plan)
    with pytest.raises(hp.PlanInvariantError, match=message):
        hp.check_plan(hp.KVCachePlan.model_validate(plan))


def test_every_stage_names_its_own_pool() -> None:
    plan = vllm_plan("regular_llama3_70b_pp4_autofit")
    assert [pool["name"] for pool in plan["pools"]] == [f"device.{k}" for k in range(4)]
    assert {tensor["pool"] for tensor in plan["tensors"]} == {f"device.{k}" for k in range(4)}
    plan["tensors"][0]["pool"], plan["tensors"][1]["pool"] = (
        plan["tensors"][1]["pool"], plan["tensors"][0]["pool"])
    with pytest.raises(hp.PlanInvariantError, match="the device pool of its stage"):
        hp.check_plan(hp.KVCachePlan.model_validate(plan))




def _v_range_into_next_block(plan: dict[str, Any]) -> None:
    plan["tensors"][0]["ranges"][1]["offset"] = HALF - 64


def _range_past_the_buffer(plan: dict[str, Any]) -> None:
    plan["tensors"][0]["ranges"][1]["offset"] = HALF + 64


def _blocks_overlap(plan: dict[str, Any]) -> None:
    plan["tensors"][0]["block_stride"] //= 2


def _view_past_the_buffer(plan: dict[str, Any]) -> None:
    plan["tensors"][0]["views"][1]["storage_offset"] += 1


def _layer_stride_in_per_layer_pool(plan: dict[str, Any]) -> None:
    plan["tensors"][0]["layer_stride"] = 64


def _two_pools_one_name(plan: dict[str, Any]) -> None:
    plan["pools"].append(copy.deepcopy(plan["pools"][0]))


def _unknown_pool(plan: dict[str, Any]) -> None:
    plan["tensors"][0]["pool"] = "swa"


def _layer_placed_twice(plan: dict[str, Any]) -> None:
    second = copy.deepcopy(plan["tensors"][0])
    second["layers"] = ["l1"]
    plan["tensors"].append(second)


def _ranges_out_of_order(plan: dict[str, Any]) -> None:
    plan["tensors"][0]["ranges"].reverse()


@pytest.mark.parametrize(("tamper", "message"), [
    (_v_range_into_next_block, "share byte"),
    (_range_past_the_buffer, "past the kv"),
    (_blocks_overlap, "overlaps block 1|share byte"),
    (_view_past_the_buffer, "view 'v_buffer' ends at byte"),
    (_layer_stride_in_per_layer_pool, "per-layer pool"),
    (_two_pools_one_name, "unique pool names"),
    (_unknown_pool, "names pool 'swa'"),
    (_layer_placed_twice, "once per pool"),
    (_ranges_out_of_order, "in order and apart"),
])
def test_ranged_pages_stay_inside_and_apart(tamper: Tamper, message: str) -> None:
    plan = mha_plan()
    hp.check_plan(SGLangPlan.model_validate(plan))
    tamper(plan)
    with pytest.raises(hp.PlanInvariantError, match=message):
        hp.check_plan(SGLangPlan.model_validate(plan))


def test_a_plan_of_either_engine_loads_by_its_engine() -> None:
    from hisparse_plan.models.any_plan import load_plan

    assert isinstance(load_plan(mha_plan()), SGLangPlan)
    assert isinstance(load_plan(vllm_plan()), hp.KVCachePlan)
    with pytest.raises(hp.PlanError, match="a plan's JSON text"):
        load_plan("{not json")
