"""Malformed requests: only pydantic's ValidationError or a PlanError may come out."""

from __future__ import annotations

import copy
import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

import hisparse_plan as hp
from support.golden import load
from support.planning_support import quiet_plan

BASE, _ = load("bf16_small_with_full_attention")
GARBAGE: list[Any] = [
    None, True, False, 0, -1, 1, 2**70, -(2**70), 0.5, -0.0, math.nan, math.inf, -math.inf,
    "", "x", "64", "BLNHC", "mla", "unknown_kind", "float64", [], [1], {}, {"kind": "mla"},
]


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key path in a JSON tree, the root excluded."""
    paths = []
    if isinstance(node, dict):
        for key, value in node.items():
            paths.append((*prefix, key))
            paths.extend(_paths(value, (*prefix, key)))
    return paths


PATHS = _paths(BASE)


def _outcome(request: Any) -> str:
    try:
        plan = quiet_plan(request)
    except ValidationError:
        return "invalid"
    except hp.PlanError as error:
        refusal = str(error)
        return "refused" if refusal else "silent refusal"
    hp.check_plan(plan)
    return "planned"


def _parent(request: dict[str, Any], path: tuple[Any, ...]) -> dict[str, Any]:
    node = request
    for key in path[:-1]:
        node = node[key]
    return node


@settings(max_examples=400)
@given(st.sampled_from(PATHS), st.sampled_from(GARBAGE))
def test_any_field_replaced_by_garbage(path: tuple[Any, ...], value: Any) -> None:
    request = copy.deepcopy(BASE)
    _parent(request, path)[path[-1]] = value
    assert _outcome(request) in {"invalid", "refused", "planned"}


@settings(max_examples=200)
@given(st.sampled_from(PATHS), st.sampled_from(["drop", "extra", "rename_empty"]))
def test_keys_dropped_added_or_renamed(path: tuple[Any, ...], change: str) -> None:
    request = copy.deepcopy(BASE)
    parent = _parent(request, path)
    if change == "drop":
        del parent[path[-1]]
    elif change == "extra":
        parent["surprise"] = 1
    else:
        parent[""] = parent.pop(path[-1])
    assert _outcome(request) in {"invalid", "refused", "planned"}


@settings(max_examples=200)
@given(st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=12,
))
def test_arbitrary_json_trees(tree: Any) -> None:
    assert _outcome(tree) in {"invalid", "refused"}


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("layers",), {}),
        (("model", "max_model_len"), 0),
        (("model", "index_topk"), -5),
        (("model", "max_model_len"), True),
        (("model", "max_model_len"), 2**70),
        (("model", "max_model_len"), 8192.0),
        (("hisparse", "host_pool_gib"), math.nan),
        (("hisparse", "host_pool_gib"), math.inf),
        (("hisparse", "host_pool_gib"), 0),
        (("hisparse", "host_pool_gib"), 2.0**40),
        (("device", "available_bytes"), -1),
        (("device", "kv_cache_layout"), "BNLHC"),
        (("device", "num_blocks_override"), 0),
        (("scheduler", "max_num_batched_tokens"), "8192"),
    ],
)
def test_malformed_values_are_validation_errors(path: tuple[str, ...], value: Any) -> None:
    request = copy.deepcopy(BASE)
    _parent(request, path)[path[-1]] = value
    with pytest.raises(ValidationError):
        hp.PlanRequest.model_validate(request)


@pytest.mark.parametrize(
    "layer",
    [
        {"kind": "mla", "block_size": 64, "head_size": 576, "dtype": "float64"},
        {"kind": "linear_attention", "block_size": 64},
        {"kind": "mla", "block_size": 64, "head_size": 576, "state_content_bytes": 0},
        {"kind": "mla", "block_size": 64, "head_size": 576, "dtype": "bfloat16",
         "state_content_bytes": 655},
        {"kind": "mla", "block_size": 64, "head_size": 576, "page_size_bytes": 1},
        {"kind": "mla", "block_size": 2**62, "head_size": 2**20, "dtype": "float32"},
        {"kind": "full_attention", "block_size": 64, "head_size": 64},
        {"kind": "sliding_window", "block_size": 64, "num_kv_heads": 1, "head_size": 64},
        {"kind": "mla", "block_size": 64, "head_size": 576, "cache_role": "dense"},
    ],
)
def test_malformed_layer_specs_are_validation_errors(layer: dict[str, Any]) -> None:
    request = copy.deepcopy(BASE)
    request["layers"]["model.layers.0.self_attn.attn"] = layer
    with pytest.raises(ValidationError):
        hp.PlanRequest.model_validate(request)


def test_empty_layer_name_is_a_validation_error() -> None:
    request = copy.deepcopy(BASE)
    request["layers"][""] = request["layers"].pop("model.extra.0.attn")
    with pytest.raises(ValidationError):
        hp.PlanRequest.model_validate(request)


@pytest.mark.parametrize("taken", [
    "model.layers.0.self_attn.attn.hisparse_hot", "a\nb.hisparse_resident", "x.hisparse_hot\n"
    "y.hisparse_hot",
])
def test_reserved_layer_names_are_validation_errors(taken: str) -> None:
    request = copy.deepcopy(BASE)
    request["layers"][taken] = request["layers"].pop("model.extra.0.attn")
    with pytest.raises(ValidationError, match="reserved"):
        hp.PlanRequest.model_validate(request)


@pytest.mark.parametrize("name", ["a.hisparse_hot\nb", "a.hisparse_resident.x", "hisparse_hot"])
def test_names_that_only_contain_a_reserved_ending_are_taken(name: str) -> None:
    request = copy.deepcopy(BASE)
    request["layers"][name] = request["layers"].pop("model.extra.0.attn")
    assert name in hp.PlanRequest.model_validate(request).layers


def test_json_text_with_nan_and_huge_numbers() -> None:
    text = json.dumps(BASE).replace('"host_pool_gib": 1', '"host_pool_gib": NaN')
    with pytest.raises(ValidationError):
        hp.PlanRequest.model_validate_json(text)
    text = json.dumps(BASE).replace('"max_model_len": 8192', '"max_model_len": ' + str(2**70))
    with pytest.raises(ValidationError):
        hp.PlanRequest.model_validate_json(text)


def test_a_page_beyond_int64_is_refused() -> None:
    request = copy.deepcopy(BASE)
    request["device"]["num_blocks_override"] = 2**62
    with pytest.raises(hp.PlanError, match="int64"):
        hp.plan(request)
