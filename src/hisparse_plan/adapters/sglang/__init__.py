"""hisparse_plan for SGLang 0.5.23: requests from its server arguments, plans as its own report,
its pool classes' kwargs. May import what adapters/ may, never SGLang (it works without it).

Server arguments come as a dict or as SGLang's own ServerArgs object (`request_from_sglang`);
`report` gives the report SGLang's own pools give, `pool_kwargs` the keyword arguments its pool
classes take for a plan.

SGLang is never imported here: this package works without it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from hisparse_plan.adapters.sglang.pool_kwargs import pool_kwargs
from hisparse_plan.adapters.sglang.report import layer_id, report
from hisparse_plan.adapters.sglang.request import (
    mapping_argument,
    request_from_server_args,
    settings_from_server_args,
    sglang_request,
)
from hisparse_plan.adapters.sglang.server_args import (
    request_from_sglang,
    server_args_mapping,
    settings_from_sglang,
)
from hisparse_plan.adapters.sglang.stages import rank_plans, stages_report
from hisparse_plan.errors import HisparsePlanError


def report_for_case(case: Mapping[str, Any]) -> dict[str, Any]:
    """A reference case (`{"config": dict or path, "server_args": {...}, "memory": {...}}`,
    optionally `"gpu": {"total_memory_bytes": N}` for SGLang's default mem_fraction_static)
    planned as SGLang would size it, as the reference report; a refusal is `{"error":
    message}`."""
    from hisparse_plan.targets.sglang import plan_sglang

    try:
        case = mapping_argument(case, "case")
        for key in ("config", "server_args", "memory"):
            if key not in case:
                raise HisparsePlanError(f"{key}: missing; expected in a case")
        request = request_from_server_args(case["config"], case["server_args"], case["memory"],
                                           gpu=case.get("gpu"),
                                           draft_config=case.get("draft_config"))
        if request.engine is not None and request.engine.pp_size > 1:
            return stages_report(request)
        return report(plan_sglang(request))
    except (HisparsePlanError, ValidationError, OSError, ValueError) as error:
        return {"error": f"{type(error).__name__}: {error}"}


__all__ = [
    "layer_id",
    "pool_kwargs",
    "rank_plans",
    "report",
    "report_for_case",
    "request_from_server_args",
    "request_from_sglang",
    "server_args_mapping",
    "settings_from_server_args",
    "settings_from_sglang",
    "sglang_request",
    "stages_report",
]
