"""The pydantic models: strict, frozen, closed, and derived fields that round-trip."""

from __future__ import annotations

import copy
import json
import pickle

import pytest
from pydantic import ValidationError

import hisparse_plan as hp
from hisparse_plan.models import KVCacheLayout
from support.golden import GOLDEN as GOLDEN_DIR
from support.golden import load


def test_layer_page_sizes_follow_spec_5_1() -> None:
    fp8 = hp.MLASpec(block_size=64, head_size=576, dtype="uint8", state_content_bytes=656)
    assert fp8.page_size_bytes == 64 * 656
    bf16 = hp.MLASpec(block_size=64, head_size=576)
    assert bf16.page_size_bytes == 64 * 576 * 2
    full = hp.FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, head_size_v=64)
    assert full.page_size_bytes == 8 * 16 * (128 + 64) * 2
    window = hp.SlidingWindowSpec(block_size=16, num_kv_heads=2, head_size=64,
                                  dtype="float32", sliding_window=128)
    assert window.head_size_v == 64
    assert window.page_size_bytes == 2 * 16 * 128 * 4


def test_derived_fields_are_stored_and_checked() -> None:
    spec = hp.MLASpec(block_size=64, head_size=128, dtype="uint8")
    dumped = spec.model_dump(mode="json")
    assert dumped["page_size_bytes"] == 8192
    assert hp.MLASpec.model_validate(dumped) == spec
    with pytest.raises(ValidationError, match="expected 8192"):
        hp.MLASpec.model_validate({**dumped, "page_size_bytes": 8193})
    uniform = hp.UniformTypeSpec(block_size=64, specs={"a": spec, "b": spec})
    assert uniform.page_size_bytes == 16384
    with pytest.raises(ValidationError, match="expected 16384"):
        hp.UniformTypeSpec.model_validate({**uniform.model_dump(), "page_size_bytes": 1})
    with pytest.raises(ValidationError, match="block_size"):
        hp.UniformTypeSpec(block_size=32, specs={"a": spec})


def test_numbers_are_strict() -> None:
    with pytest.raises(ValidationError):
        hp.MLASpec.model_validate({"kind": "mla", "block_size": True, "head_size": 64})
    with pytest.raises(ValidationError):
        hp.MLASpec.model_validate({"kind": "mla", "block_size": 64.0, "head_size": 64})
    with pytest.raises(ValidationError):
        hp.MLASpec.model_validate({"kind": "mla", "block_size": "64", "head_size": 64})
    with pytest.raises(ValidationError):
        hp.MLASpec.model_validate({"kind": "mla", "block_size": -64, "head_size": 64})


def test_models_are_frozen_and_closed() -> None:
    spec = hp.MLASpec(block_size=64, head_size=64)
    with pytest.raises(ValidationError):
        spec.block_size = 32  # type: ignore[misc]
    with pytest.raises(ValidationError, match="Extra inputs"):
        hp.MLASpec.model_validate({"kind": "mla", "block_size": 64, "head_size": 64, "x": 1})


@pytest.mark.parametrize(
    ("layout", "outermost", "compact", "layer_compact"),
    [
        ("LBNHC", False, True, True),
        ("LBHNC", False, True, True),
        ("LHBNC", False, False, True),
        ("BLHNC", True, True, False),
        ("BLNHC", True, True, False),
        ("BHLNC", True, False, False),
    ],
)
def test_layout_traits(layout: str, outermost: bool, compact: bool, layer_compact: bool) -> None:
    member = KVCacheLayout(layout)
    assert "".join(member.axes) == layout
    assert (member.block_outermost, member.block_compact, member.layer_compact) == (
        outermost, compact, layer_compact,
    )


def test_planning_shares_equal_specs() -> None:
    """Equal layer specs become one object when planning starts: grouping compares identity."""
    from hisparse_plan.targets.vllm.pipeline import request_layers

    request = hp.PlanRequest.model_validate(load("deepseek_v32_fp8")[0])
    sources = [s for _, s in request_layers(request) if isinstance(s, hp.MLASpec)
               and s.cache_role == "sparse"]
    assert len(sources) == 61
    assert all(spec is sources[0] for spec in sources)
    # Validation already shares one model per distinct layer input (sparse, indexer).
    assert len({id(s) for s in request.layers.values()}) == 2


def test_plan_round_trips_through_json() -> None:
    plan = hp.plan(load("glm5_fp8_blhnc")[0])
    text = plan.model_dump_json()
    again = hp.KVCachePlan.model_validate_json(text)
    assert again == plan
    assert again.model_dump_json() == text
    assert plan.schema_version == 2


@pytest.mark.parametrize("case", ["glm5_fp8_blhnc", "regular_llama3_70b_pp4_autofit",
                                  "regular_qwen3_next_80b_mamba"])
def test_a_version_1_plan_reads_as_the_same_version_2_plan(case: str) -> None:
    """A plan written before pools were listed (no `pools`, no tensor `pool`) still loads, as
    the plan the planner makes today."""
    plan = hp.plan(load(case)[0])
    old = plan.model_dump(mode="json")
    old["schema_version"] = 1
    del old["pools"], old["engine"]
    for tensor in old["tensors"]:
        del tensor["pool"], tensor["ranges"], tensor["views"]
    assert hp.KVCachePlan.model_validate(old) == plan
    assert hp.KVCachePlan.model_validate_json(json.dumps(old)) == plan


def test_a_validated_request_and_its_plan_are_read_only() -> None:
    request = hp.PlanRequest.model_validate(load("deepseek_v32_fp8")[0])
    with pytest.raises(TypeError, match="read-only"):
        request.layers["extra"] = request.layers["model.layers.0.self_attn.attn"]
    with pytest.raises(TypeError, match="read-only"):
        request.layers.pop("model.layers.0.self_attn.attn")
    plan = hp.plan(request)
    specs = plan.groups[0].spec.specs  # type: ignore[union-attr]
    with pytest.raises(TypeError, match="read-only"):
        specs.clear()
    with pytest.raises(ValidationError):
        plan.num_blocks = 1  # type: ignore[misc]
    assert copy.deepcopy(plan) == plan
    assert pickle.loads(pickle.dumps(plan)) == plan


def test_model_validate_json_refuses_a_duplicated_key_naming_it() -> None:
    text = (GOLDEN_DIR / "deepseek_v32_fp8.request.json").read_text()
    assert hp.PlanRequest.model_validate_json(text) == hp.PlanRequest.model_validate(
        load("deepseek_v32_fp8")[0])
    doubled = text.replace('"max_model_len": 163840', '"max_model_len": 163840, '
                           '"max_model_len": 2')
    with pytest.raises(hp.PlanError, match="duplicate key 'max_model_len'") as refused:
        hp.PlanRequest.model_validate_json(doubled)
    assert refused.value.field == "model.max_model_len"
