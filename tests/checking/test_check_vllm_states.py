"""vLLM plans: each Mamba state viewable in its own dtype (the planner refuses a page vLLM
could not view, check_plan a plan that moves a state off its elements), a padded page inside
its pool, and pipeline stages that list every device layer once. The edits here were accepted
before (references/fuzz_plan_edits.py found them); offsets are worked out by hand."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import hisparse_plan as hp

MIB = 2**20


def _request(layers: dict[str, Any], **device: Any) -> dict[str, Any]:
    return {"layers": layers, "model": {"max_model_len": 64},
            "device": {"available_bytes": MIB, **device}}


def _mamba(shapes: list[list[int]], dtypes: list[str], **extra: Any) -> dict[str, Any]:
    return {"kind": "mamba", "block_size": 16, "state_shapes": shapes, "state_dtypes": dtypes,
            **extra}


ATTENTION = {"kind": "full_attention", "block_size": 16, "head_size": 64, "num_kv_heads": 1}
"""A 4096-byte page (16 tokens x 128 bf16 elements): blocks 4096 bytes apart beside it."""


# --- the planner ------------------------------------------------------------------------------


@pytest.mark.parametrize(("layers", "state", "why"), [
    # uint8 [3] then float32 [4]: the float32 state 3 bytes into a 19-byte page.
    ({"m": _mamba([[3], [4]], ["uint8", "float32"])}, 1, "starts at byte 3"),
    # float32 [4] then uint8 [3]: aligned starts, but blocks 19 bytes apart.
    ({"m": _mamba([[4], [3]], ["float32", "uint8"])}, 0, "blocks 19 bytes apart"),
    # Beside attention the block is 4096 bytes; the float32 state is still at byte 3.
    ({"a": ATTENTION, "m": _mamba([[3], [4]], ["uint8", "float32"])}, 1, "starts at byte 3"),
], ids=["odd_start", "odd_block", "odd_start_beside_attention"])
def test_the_planner_refuses_a_state_vllm_cannot_view(
    layers: dict[str, Any], state: int, why: str
) -> None:
    with pytest.raises(hp.PlanError, match=why) as raised:
        hp.plan(_request(layers))
    assert raised.value.field == f"layers['m'].state_dtypes[{state}]"


@pytest.mark.parametrize("layers", [
    {"m": _mamba([[4], [4]], ["float32", "uint8"])},  # 20-byte page: float32 at 0, stride 20
    {"a": ATTENTION, "m": _mamba([[4], [3]], ["float32", "uint8"])},  # stride 4096
    {"m": _mamba([[3], [4]], ["uint8", "float32"], state_alignment=4)},  # float32 at 4
], ids=["aligned_page", "aligned_beside_attention", "state_alignment"])
def test_the_planner_places_states_vllm_can_view(layers: dict[str, Any]) -> None:
    hp.check_plan(hp.plan(_request(layers)))


# --- check_plan -------------------------------------------------------------------------------


def _hybrid() -> dict[str, Any]:
    """Attention and a Mamba layer of bf16 [2, 8] (32 bytes) then float32 [4] (16 bytes):
    the float32 state 32 bytes into the Mamba page, blocks 4096 bytes apart."""
    plan = hp.plan(_request({"a": ATTENTION, "m": _mamba([[2, 8], [4]],
                                                          ["bfloat16", "float32"])}))
    data = plan.model_dump(mode="json")
    tensor = _mamba_tensor(data)
    assert (tensor["offset"], tensor["block_stride"]) == (0, 4096)
    return data


def _mamba_tensor(plan: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = next(t for t in plan["tensors"] if t["layers"] == ["m"])
    return found


@pytest.mark.parametrize(("field", "delta", "why"), [
    ("offset", 1, r"state 0 \(bfloat16\) starts at byte 1"),
    ("offset", 2, r"state 1 \(float32\) starts at byte 34"),
    ("block_stride", 2, r"state 1 \(float32\) starts at byte 32 .* 4098 bytes apart"),
])
def test_check_plan_refuses_a_state_off_its_elements(field: str, delta: int, why: str) -> None:
    plan = _hybrid()
    _mamba_tensor(plan)[field] += delta
    with pytest.raises(hp.PlanInvariantError, match=why):
        hp.check_plan(plan)


def test_check_plan_takes_a_state_moved_by_whole_elements() -> None:
    # 4 bytes on: bf16 at 4, float32 at 36, both whole elements, inside the same block.
    plan = _hybrid()
    _mamba_tensor(plan)["offset"] += 4
    hp.check_plan(plan)


def test_a_padded_page_ends_inside_its_pool() -> None:
    # One Mamba layer of 48 bytes padded to 64: 16 bytes on, the last page's states still end
    # at the pool's last byte, its padding 16 bytes past it.
    plan = hp.plan(_request({"m": _mamba([[2, 8], [4]], ["bfloat16", "float32"],
                                         page_size_padded=64)})).model_dump(mode="json")
    tensor = _mamba_tensor(plan)
    assert (tensor["block_stride"], tensor["size"]) == (64, 64 * plan["num_blocks"])
    tensor["offset"] += 16
    with pytest.raises(hp.PlanInvariantError, match=r"page ends at byte .*padding included"):
        hp.check_plan(plan)


# --- pipeline stages ----------------------------------------------------------------------------


def _staged(stages: list[list[str]]) -> dict[str, Any]:
    layers = {f"l{i}": ATTENTION for i in range(sum(len(names) for names in stages))}
    request = _request(layers, available_bytes=0, pipeline_stages=[
        {"layers": names, "available_bytes": MIB} for names in stages])
    return hp.plan(request).model_dump(mode="json")


Edit = Callable[[dict[str, Any]], None]


def _listed(stage: int, names: list[str] | None) -> Edit:
    def edit(plan: dict[str, Any]) -> None:
        plan["device_pools"][stage]["layers"] = names

    return edit


@pytest.mark.parametrize(("edit", "why"), [
    (_listed(0, ["l0", "l0", "l1"]), "which stage 0 lists too"),
    (_listed(1, ["l2", "l3", "l0"]), "which stage 0 lists too"),
    (_listed(0, ["l0", "l1", "x"]), "expected device layers"),
    (_listed(1, None), "null beside"),
], ids=["twice_in_a_stage", "in_two_stages", "not_a_layer", "one_stage_unlisted"])
def test_stages_list_every_device_layer_once(edit: Edit, why: str) -> None:
    plan = _staged([["l0", "l1"], ["l2", "l3"]])
    hp.check_plan(plan)
    edit(plan)
    with pytest.raises(hp.PlanInvariantError, match=why):
        hp.check_plan(plan)


def test_one_listed_stage_lists_every_layer() -> None:
    # device.pipeline_stages of one entry: the planner's plan lists the stage's layers.
    plan = _staged([["l0", "l1"]])
    assert plan["device_pools"][0]["layers"] == ["l0", "l1"]
    hp.check_plan(plan)
    _listed(0, ["l0"])(plan)
    with pytest.raises(hp.PlanInvariantError, match="'l1' is in no stage"):
        hp.check_plan(plan)



def test_every_stage_states_the_one_override() -> None:
    # Found by references/fuzz_plan_edits.py --seed 3: one stage's own override was accepted.
    plan = _staged([["l0", "l1"], ["l2", "l3"]])
    hp.check_plan(plan)
    plan["device_pools"][1]["num_blocks_override"] = plan["num_blocks"]
    with pytest.raises(hp.PlanInvariantError, match=r"device_pools\[1\]\.num_blocks_override"):
        hp.check_plan(plan)
