"""JSON Schemas of the request and plan contracts."""

from __future__ import annotations

from typing import Any

from hisparse_plan.models import KVCachePlan, PlanRequest


def json_schemas() -> dict[str, dict[str, Any]]:
    """{"request": ..., "plan": ...}: what `PlanRequest` accepts and what a plan dumps to."""
    return {
        "request": PlanRequest.model_json_schema(mode="validation"),
        "plan": KVCachePlan.model_json_schema(mode="serialization"),
    }
