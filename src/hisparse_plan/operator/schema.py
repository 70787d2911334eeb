"""JSON Schemas of the request and plan contracts."""

from __future__ import annotations

from typing import Any

from hisparse_plan.models import KVCachePlan, PlanRequest
from hisparse_plan.models.engines import SGLangPlan


def json_schemas() -> dict[str, dict[str, Any]]:
    """{"request": ..., "plan": ..., "sglang-plan": ...}: what `PlanRequest` accepts, and what
    a vLLM plan and an SGLang plan dump to."""
    return {
        "request": PlanRequest.model_json_schema(mode="validation"),
        "plan": KVCachePlan.model_json_schema(mode="serialization"),
        "sglang-plan": SGLangPlan.model_json_schema(mode="serialization"),
    }
