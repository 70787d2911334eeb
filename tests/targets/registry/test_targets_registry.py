"""One registry picks an engine's target: every target package under targets/ is in it, each
offers `plan(request)`, and the plan it returns is that engine's."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

import hisparse_plan as hp
from hisparse_plan.targets import registry
from hisparse_plan.targets.sglang import plan_sglang
from support.golden import load
from support.sglang_requests import mha, request

TARGETS_DIR = Path(registry.__file__).parent


def test_every_target_package_is_registered_under_its_own_name() -> None:
    packages = {path.parent.name for path in TARGETS_DIR.glob("*/__init__.py")}
    assert packages == set(registry.TARGETS)
    for name, module in registry.TARGETS.items():
        assert module == f"hisparse_plan.targets.{name}"


@pytest.mark.parametrize("name", sorted(registry.TARGETS))
def test_a_target_offers_plan(name: str) -> None:
    package = importlib.import_module(registry.TARGETS[name])
    assert callable(package.plan)
    assert registry.target(name) is package


def test_a_request_without_engine_is_planned_by_vllm() -> None:
    vllm_request = hp.PlanRequest.model_validate(load("regular_gemma3_27b_swa")[0])
    assert registry.engine_name(vllm_request) == "vllm"
    planned = hp.plan_for_engine(vllm_request)
    assert planned == hp.plan(vllm_request)
    assert planned.engine == "vllm"


def test_a_request_naming_sglang_is_planned_by_sglang() -> None:
    req = request({f"l{i}": mha() for i in range(4)}, available=2 * 2**30, page_size=16)
    assert registry.engine_name(req) == "sglang"
    planned = hp.plan_for_engine(req.model_dump(mode="json"))  # a mapping is validated first
    assert planned == plan_sglang(req)
    assert planned.engine == "sglang"


def test_an_unknown_engine_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(hp.UnsupportedRequestError,
                       match=r"engine: expected one of vllm, sglang, got 'tensorrt_llm'"):
        registry.target("tensorrt_llm")
