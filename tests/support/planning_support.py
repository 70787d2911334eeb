"""The one quiet way tests plan: PlanWarnings silenced, a refusal as None."""

from __future__ import annotations

import warnings
from collections.abc import Mapping

import hisparse_plan as hp


def quiet_plan(request: hp.PlanRequest | Mapping[str, object]) -> hp.KVCachePlan:
    """plan() without the PlanWarning a wasteful hot buffer gives; refusals still raise."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", hp.PlanWarning)
        return hp.plan(request)


def plan_or_none(request: hp.PlanRequest | Mapping[str, object]) -> hp.KVCachePlan | None:
    """The plan, or None when the request is refused with a PlanError."""
    try:
        return quiet_plan(request)
    except hp.PlanError:
        return None
