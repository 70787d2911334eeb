"""Every model the library hands out is read-only all the way down, and JSON-only input.

A frozen model refuses `model.field = x`, but a list or dict inside it could still be changed
in place: a request's Mamba state shapes edited after validation would reach the planner
unchecked and give an unsound plan.
"""

from __future__ import annotations

import copy
import pickle
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

import hisparse_plan as hp
from hisparse_plan.models.base import FrozenDict, FrozenList
from support.golden import load

MAMBA_SPEC: dict[str, Any] = {"kind": "mamba", "block_size": 16,
                              "state_shapes": [[4, 8], [16]],
                              "state_dtypes": ["bfloat16", "float32"]}
ATTENTION_SPEC: dict[str, Any] = {"kind": "full_attention", "block_size": 16,
                                  "num_kv_heads": 2, "head_size": 64}
MAMBA_REQUEST: dict[str, Any] = {
    "layers": {
        "model.layers.0.mixer": MAMBA_SPEC, "model.layers.1.attn": ATTENTION_SPEC,
        "model.layers.2.mixer": MAMBA_SPEC, "model.layers.3.attn": ATTENTION_SPEC,
    },
    "model": {"max_model_len": 64},
    "device": {"available_bytes": 2**24, "pipeline_stages": [
        {"layers": ["model.layers.0.mixer", "model.layers.1.attn"], "available_bytes": 2**24},
        {"layers": ["model.layers.2.mixer", "model.layers.3.attn"], "available_bytes": 2**24},
    ]},
}


def _containers(value: object, path: str) -> Iterator[tuple[str, object]]:
    """Every list and dict reachable from `value` through model fields, with its path."""
    if isinstance(value, BaseModel):
        for name in type(value).model_fields:
            yield from _containers(getattr(value, name), f"{path}.{name}")
    elif isinstance(value, list | dict):
        yield path, value
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            yield from _containers(item, f"{path}[{key!r}]")


def _handed_out() -> list[tuple[str, BaseModel]]:
    request = hp.PlanRequest.model_validate(MAMBA_REQUEST)
    golden_request, _ = load("deepseek_v32_fp8")
    golden = hp.PlanRequest.model_validate(golden_request)
    sglang = hp.PlanRequest.model_validate(
        {**MAMBA_REQUEST, "device": {"available_bytes": 2**26},
         "engine": {"name": "sglang", "context_length": 64, "page_size": 16}})
    return [("mamba request", request), ("mamba plan", hp.plan(request)),
            ("hisparse request", golden), ("hisparse plan", hp.plan(golden)),
            ("sglang request", sglang), ("sglang plan", hp.plan_for_engine(sglang))]


@pytest.mark.parametrize(("what", "model"), _handed_out(), ids=lambda v: str(v)[:20])
def test_no_list_or_dict_inside_a_model_can_change(what: str, model: BaseModel) -> None:
    containers = list(_containers(model, what))
    assert containers
    for path, container in containers:
        assert isinstance(container, FrozenList | FrozenDict), (path, type(container))


def _read_only(target: list[Any]) -> FrozenList[Any]:
    assert isinstance(target, FrozenList)
    return target


def _mutations(target: list[Any]) -> list[Callable[[], object]]:
    return [lambda: target.append(1), lambda: target.__setitem__(0, 1),
            lambda: target.__delitem__(0), lambda: target.extend([1]), target.clear,
            target.sort, target.reverse, lambda: target.insert(0, 1), target.pop,
            lambda: target.__iadd__([1]), lambda: FrozenList.__init__(
                _read_only(target), [1])]


def test_mamba_states_cannot_be_edited_under_the_planner() -> None:
    request = hp.PlanRequest.model_validate(MAMBA_REQUEST)
    spec = request.layers["model.layers.0.mixer"]
    assert isinstance(spec, hp.models.MambaSpec)
    for target in (spec.state_dtypes, spec.state_shapes, spec.state_shapes[0]):
        for mutate in _mutations(target):
            with pytest.raises(TypeError, match="read-only"):
                mutate()
    assert spec.state_dtypes == ["bfloat16", "float32"]
    assert spec.state_shapes == [[4, 8], [16]]


def test_plan_lists_cannot_be_edited() -> None:
    plan = hp.plan(MAMBA_REQUEST)
    pool_layers = plan.device_pools[0].layers
    assert pool_layers is not None
    targets: list[list[Any]] = [plan.groups, plan.tensors, plan.device_pools, plan.warnings,
                                plan.groups[0].layer_names, plan.tensors[0].layers, pool_layers]
    for target in targets:
        with pytest.raises(TypeError, match="read-only"):
            target.append(target[0] if target else "x")


def test_read_only_lists_still_behave_as_lists() -> None:
    """Equal to lists, JSON arrays, copied and pickled, and validated anew from themselves."""
    plan = hp.plan(MAMBA_REQUEST)
    dumped = plan.model_dump_json()
    assert hp.KVCachePlan.model_validate_json(dumped).model_dump_json() == dumped
    assert hp.KVCachePlan.model_validate(plan.model_dump()) == plan
    assert copy.deepcopy(plan) == plan
    assert pickle.loads(pickle.dumps(plan)) == plan
    assert plan.tensors[0].layers == list(plan.tensors[0].layers)
    request = hp.PlanRequest.model_validate(MAMBA_REQUEST)
    spec = request.layers["model.layers.0.mixer"]
    assert isinstance(spec, hp.models.MambaSpec)
    edited = [*spec.state_shapes, [1]]  # building a new list is fine
    assert edited == [[4, 8], [16], [1]]


@pytest.mark.parametrize("text", [None, 5, 1.5, memoryview(b"{}"), ["{}"], object()])
@pytest.mark.parametrize("model", [hp.PlanRequest, hp.KVCachePlan])
def test_json_validation_of_something_not_text_is_refused(
    model: type[BaseModel], text: object
) -> None:
    with pytest.raises((ValidationError, hp.PlanError)) as caught:
        model.model_validate_json(text)  # type: ignore[arg-type]
    assert not isinstance(caught.value, TypeError)
    assert "str, bytes or bytearray" in str(caught.value) or "string, bytes or bytearray" in str(
        caught.value)
