"""A request's equal layers are validated once and share one model; nothing else changes: the
same specs, the same field sets, the same errors as validating every layer on its own."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError

import hisparse_plan as hp
from hisparse_plan.models import LayerSpec
from hisparse_plan.models.distinct import content_key
from support.golden import load
from support.strategies import any_layer_spec

ONE_LAYER: TypeAdapter[Any] = TypeAdapter(LayerSpec)


def request_with(layers: dict[str, Any]) -> dict[str, Any]:
    return {"layers": layers, "model": {"max_model_len": 1024},
            "device": {"available_bytes": 2**30}}


def mla(**fields: Any) -> dict[str, Any]:
    return {"kind": "mla", "block_size": 64, "head_size": 576, **fields}


def errors_of(data: dict[str, Any]) -> list[tuple[object, ...]]:
    with pytest.raises(ValidationError) as caught:
        hp.PlanRequest.model_validate(data)
    return [(tuple(e["loc"]), e["type"], e["msg"]) for e in caught.value.errors()]


def assert_each_layer_as_alone(request: hp.PlanRequest, layers: dict[str, Any]) -> None:
    """Every layer of `request` is what validating its input alone gives: class, fields and
    the set of fields given."""
    for name, raw in layers.items():
        alone = ONE_LAYER.validate_python(raw)
        spec = request.layers[name]
        assert type(spec) is type(alone)
        assert spec.__dict__ == alone.__dict__
        assert spec.model_fields_set == alone.model_fields_set


def test_equal_layers_share_one_model() -> None:
    request = hp.PlanRequest.model_validate(request_with({f"l{i}": mla() for i in range(5)}))
    assert len({id(spec) for spec in request.layers.values()}) == 1
    assert list(request.layers) == [f"l{i}" for i in range(5)]


def test_layers_equal_only_after_defaults_keep_their_own_field_sets() -> None:
    # head_size_v given, or left to default to head_size: equal specs, different inputs.
    given_v = {"kind": "full_attention", "block_size": 16, "num_kv_heads": 1, "head_size": 64,
               "head_size_v": 64}
    default_v = {key: value for key, value in given_v.items() if key != "head_size_v"}
    request = hp.PlanRequest.model_validate(
        request_with({"a": given_v, "b": default_v, "c": dict(given_v)}))
    a, b, c = request.layers.values()
    assert a is c
    assert a is not b
    assert "head_size_v" in a.model_fields_set
    assert "head_size_v" not in b.model_fields_set
    assert a == b


@pytest.mark.parametrize(("field", "value", "odd_value"), [
    ("block_size", 1, True),  # True == 1, but strict validation refuses a bool for an int
    ("block_size", 64, 64.0),
    ("is_index_group_leader", True, 1),
])
def test_a_copy_equal_in_value_but_not_in_type_is_validated_on_its_own(
    field: str, value: object, odd_value: object
) -> None:
    like_it = mla(**{field: value})
    odd = mla(**{field: odd_value})
    assert odd == like_it  # Python calls them equal
    errors = errors_of(request_with({"a": like_it, "b": odd, "c": dict(like_it)}))
    assert [loc for loc, _, _ in errors] == [("layers", "b", "mla", field)]


def test_nested_values_are_told_apart_by_type() -> None:
    mamba = {"kind": "mamba", "block_size": 16, "state_shapes": [[4, 8]],
             "state_dtypes": ["float32"]}
    odd = copy.deepcopy(mamba)
    odd["state_shapes"] = [[4, True]]
    errors = errors_of(request_with({"a": mamba, "b": odd, "c": copy.deepcopy(mamba)}))
    assert [loc for loc, _, _ in errors] == [("layers", "b", "mamba", "state_shapes", 0, 1)]


def test_every_bad_copy_is_reported_as_without_sharing() -> None:
    bad = mla(head_size=0)
    layers = {"a": mla(), "b": bad, "c": dict(bad), "": mla()}
    errors = errors_of(request_with(layers))
    assert [loc for loc, _, _ in errors] == [
        ("layers", "b", "mla", "head_size"),
        ("layers", "c", "mla", "head_size"),
        ("layers", "", "[key]"),
    ]


def test_content_key_tells_types_apart() -> None:
    assert content_key({"a": 1}) == content_key({"a": 1})
    assert content_key({"a": 1}) != content_key({"a": True})
    assert content_key({"a": [1]}) != content_key({"a": [1.0]})
    assert content_key({"a": 1, "b": 2}) != content_key({"b": 2, "a": 1})
    marker = object()
    assert content_key({"a": marker}) == content_key({"a": marker})
    assert content_key({"a": marker}) != content_key({"a": object()})


@settings(max_examples=60)
@given(st.data())
def test_shared_validation_gives_what_each_layer_alone_gives(data: st.DataObject) -> None:
    kinds = ["mla", "full_attention", "sliding_window", "chunked_local_attention", "mamba"]
    pool = [data.draw(any_layer_spec(block_size=16, kinds=kinds)) for _ in range(3)]
    picks = data.draw(st.lists(st.integers(0, 2), min_size=2, max_size=8))
    layers = {f"model.layers.{i}": copy.deepcopy(pool[pick]) for i, pick in enumerate(picks)}
    try:
        request = hp.PlanRequest.model_validate(request_with(layers))
    except ValidationError:
        return
    assert_each_layer_as_alone(request, layers)


def test_golden_request_plans_the_same_from_shared_specs() -> None:
    raw, _ = load("deepseek_v32_fp8")
    request = hp.PlanRequest.model_validate(raw)
    assert len({id(spec) for spec in request.layers.values()}) == 2
    for name, spec in request.layers.items():
        assert spec == ONE_LAYER.validate_python(raw["layers"][name])


@settings(max_examples=60)
@given(st.data())
def test_a_repeating_model_shares_its_specs_as_each_layer_alone_would_give(
    data: st.DataObject,
) -> None:
    # A decoder layer's specs repeated over the model (found by comparing whole lists), with
    # at most one copy changed: in value, in a value's type only, or in its key order.
    period = data.draw(st.integers(1, 3))
    unit = [data.draw(any_layer_spec(block_size=16, kinds=["mla", "full_attention"]))
            for _ in range(period)]
    repeats = data.draw(st.integers(2, 5))
    raws = [copy.deepcopy(unit[i % period]) for i in range(period * repeats)]
    where = data.draw(st.integers(0, len(raws) - 1))
    change = data.draw(st.sampled_from(["none", "type", "order", "value"]))
    field = "block_size"
    if change == "type":
        raws[where][field] = float(raws[where][field])
    elif change == "order":
        raws[where] = dict(reversed(list(raws[where].items())))
    elif change == "value":
        raws[where][field] = 32
    layers = {f"model.layers.{i}": raw for i, raw in enumerate(raws)}
    refused_alone = []
    for name, raw in layers.items():
        try:
            ONE_LAYER.validate_python(raw)
        except ValidationError:
            refused_alone.append(name)
    if refused_alone:
        with pytest.raises(ValidationError) as shared:
            hp.PlanRequest.model_validate(request_with(layers))
        assert sorted({e["loc"][1] for e in shared.value.errors()}) == sorted(refused_alone)
        return
    assert_each_layer_as_alone(hp.PlanRequest.model_validate(request_with(layers)), layers)


def test_a_float_copy_inside_a_repeating_model_is_refused_as_alone() -> None:
    layers = {f"l{i}": mla() for i in range(6)}
    layers["l4"] = mla(block_size=64.0)
    errors = errors_of(request_with(layers))
    assert [loc for loc, _, _ in errors] == [("layers", "l4", "mla", "block_size")]
