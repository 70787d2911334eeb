"""Invariants over generated requests: plan() plans soundly or refuses clearly."""

from __future__ import annotations

import warnings
from typing import Any

from hypothesis import given, settings

import hisparse_plan as hp
from support.planning_support import plan_or_none
from support.strategies import hisparse_requests, hybrid_hisparse_requests, regular_requests


def _plan_or_refuse(request: dict[str, Any]) -> hp.KVCachePlan | None:
    return plan_or_none(hp.PlanRequest.model_validate(request))


@settings(max_examples=300)
@given(hisparse_requests())
def test_every_plan_is_sound_and_round_trips(request: dict[str, Any]) -> None:
    plan = _plan_or_refuse(request)
    if plan is None:
        return
    hp.check_plan(plan)
    assert hp.KVCachePlan.model_validate_json(plan.model_dump_json()) == plan
    assert hp.KVCachePlan.model_validate(plan.model_dump(mode="json")) == plan


@settings(max_examples=100)
@given(hisparse_requests(max_layers=40))
def test_same_request_same_plan(request: dict[str, Any]) -> None:
    first = _plan_or_refuse(request)
    second = _plan_or_refuse(request)
    assert first == second
    if first is not None and second is not None:
        assert first.model_dump_json() == second.model_dump_json()


@settings(max_examples=100)
@given(hisparse_requests(max_layers=40))
def test_refusals_are_one_line_messages(request: dict[str, Any]) -> None:
    validated = hp.PlanRequest.model_validate(request)
    message = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", hp.PlanWarning)
            hp.plan(validated)
    except hp.PlanError as error:
        message = str(error)
    if message is not None:
        assert message
        assert "\n" not in message


def _sound_or_refused(request: dict[str, Any]) -> None:
    """plan() gives a plan check_plan accepts and that round-trips JSON, or a PlanError."""
    plan = _plan_or_refuse(request)
    if plan is None:
        return
    hp.check_plan(plan)
    assert hp.KVCachePlan.model_validate_json(plan.model_dump_json()) == plan
    assert plan.host_pool is None or request.get("hisparse") is not None
    if plan.fitted_max_model_len is not None:
        assert plan.fitted_max_model_len <= request["model"]["max_model_len"]


@settings(max_examples=400)
@given(regular_requests())
def test_every_regular_plan_is_sound_and_round_trips(request: dict[str, Any]) -> None:
    _sound_or_refused(request)


@settings(max_examples=200)
@given(hybrid_hisparse_requests())
def test_every_hybrid_hisparse_plan_is_sound_and_round_trips(request: dict[str, Any]) -> None:
    _sound_or_refused(request)
