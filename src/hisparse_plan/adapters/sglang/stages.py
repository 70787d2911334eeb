"""A pipeline-parallel SGLang request as the reference report gives it: every rank planned
(`engine.pp_rank` 0 to pp_size - 1), rank 0's figures on top and each rank's pools, figures
and decoder layers [start, end) under `stages` (references/sglang_reference.py's shape)."""

from __future__ import annotations

from typing import Any, Final

from hisparse_plan.adapters.sglang.report import report
from hisparse_plan.models import PlanRequest
from hisparse_plan.models.sglang_plan import SGLangPlan

STAGE_KEYS: Final = ("max_total_num_tokens", "max_running_requests", "cell_size_bytes",
                     "available_bytes", "req_to_token", "pools")
"""What the reference report keeps of each rank's report."""


def rank_plans(request: PlanRequest) -> list[SGLangPlan]:
    """The plan of every pipeline rank of `request`, in rank order (one without stages)."""
    from hisparse_plan.targets.sglang import plan_sglang

    engine = request.engine
    if engine is None or engine.pp_size == 1:
        return [plan_sglang(request)]
    return [plan_sglang(request.model_copy(
        update={"engine": engine.model_copy(update={"pp_rank": rank})}))
        for rank in range(engine.pp_size)]


def stages_report(request: PlanRequest) -> dict[str, Any]:
    """The reference report of every rank (one rank's report without stages)."""
    plans = rank_plans(request)
    reports = [report(plan) for plan in plans]
    if len(plans) == 1:
        return reports[0]
    stages = []
    for plan, rank_report in zip(plans, reports, strict=True):
        entry = {key: rank_report[key] for key in STAGE_KEYS}
        pipeline = plan.pipeline
        if pipeline is not None:
            start = pipeline.start_layer
            entry["layers"] = [start, start + pipeline.stage_layers[pipeline.pp_rank]]
        stages.append(entry)
    top = {key: value for key, value in reports[0].items() if key != "pools"}
    if "draft_pools" in reports[-1]:  # the last rank runs the draft worker
        top["draft_pools"] = reports[-1]["draft_pools"]
    return {**top, "layers": stages[0]["layers"], "stages": stages}
