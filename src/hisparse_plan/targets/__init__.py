"""Engine targets: each turns a PlanRequest into that engine's own plan. vLLM's planner is
`hisparse_plan.planning`; the others live here, one package each. `plan_for_engine` picks the
target once, by the request's `engine`."""

from __future__ import annotations

from collections.abc import Mapping

from hisparse_plan.models import PlanRequest
from hisparse_plan.models.any_plan import Plan


def plan_for_engine(request: PlanRequest | Mapping[str, object]) -> Plan:
    """The plan of the engine the request names: vLLM's `KVCachePlan` without `engine`,
    SGLang's `SGLangPlan` with `engine.name` "sglang"."""
    from hisparse_plan.targets.sglang import plan_sglang
    from hisparse_plan.targets.vllm import plan  # each target imports only when picked

    validated = request if isinstance(request, PlanRequest) else PlanRequest.model_validate(
        request)
    if validated.engine is None:
        return plan(validated)
    return plan_sglang(validated)
