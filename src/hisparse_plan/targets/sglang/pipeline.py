"""`plan_sglang()`: a request flows through named stages, each handing a finished value to the
next, each adding its decisions to a `Trace`.

    read ─▶ resolve ─▶ size ─▶ place ─▶ report
    read.py  resolve.py  size.py  place.py  report.py

read: the settings and the layers by SGLang pool (a DeepSeek-V4 request's caches by its own
pools); resolve: SGLang's server defaults for that model; size: the budget, tokens and requests;
place: the pools and buffers; report: capacity and the plan. DeepSeek-V4 runs the same stages
with its own rules in each (the `*_v4` values and rule modules)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from hisparse_plan.models.base import built_for
from hisparse_plan.models.entry_input import request_argument
from hisparse_plan.models.request import PlanRequest
from hisparse_plan.models.sglang_plan import SGLangPlan
from hisparse_plan.targets.sglang.kv_sharing import note_unwritten_buffers
from hisparse_plan.targets.sglang.place import place
from hisparse_plan.targets.sglang.read import read
from hisparse_plan.targets.sglang.report import report
from hisparse_plan.targets.sglang.resolve import resolve
from hisparse_plan.targets.sglang.size import offered_tokens, size
from hisparse_plan.targets.trace import Trace

STAGE_TITLES: Final[Mapping[str, str]] = MappingProxyType({
    "read": "model: layers by pool (see docs/planning-rules.md#sglang-pools)",
    "resolve": "server defaults (see docs/planning-rules.md#sglang-pools, #sglang-budget)",
    "size": "budget and tokens (see docs/planning-rules.md#sglang-budget)",
    "place": "pools and buffers (see docs/planning-rules.md#sglang-pools)",
    "report": "capacity (see docs/planning-rules.md#sglang-capacity)",
})
"""One section of `explain` per stage, in the order the stages run."""


@dataclass(frozen=True, slots=True)
class TracedPlan:
    plan: SGLangPlan
    trace: Trace


def plan_sglang(request: PlanRequest | Mapping[str, object]) -> SGLangPlan:
    """The pools, tensors and figures SGLang 0.5.23 allocates for `request` on one rank: read
    the layers into SGLang's pools, resolve SGLang's defaults, size the budget and tokens as
    SGLang does, lay the pools out as its classes do, and count how many context_length
    requests they hold. DeepSeek-V4 requests take SGLang's own V4 rules at each stage.

    A mapping is validated first (pydantic's ValidationError for a malformed one). Planning
    raises only PlanError: a setting that would push a figure past what the plan states is
    refused naming the setting (bounds.py), and a value any model of the plan still refuses is
    a PlanError too, never a ValidationError about a model the caller never wrote."""
    return _run(request, Trace()).plan


def plan_traced(request: PlanRequest | Mapping[str, object]) -> TracedPlan:
    """The plan with every stage's decisions and their reasons."""
    return _run(request, Trace(enabled=True))


def _run(request: PlanRequest | Mapping[str, object], trace: Trace) -> TracedPlan:
    validated = request_argument(request, "plan_sglang")
    with built_for(None, "the SGLang plan"):
        return _stages(validated, trace)


def _stages(request: PlanRequest, trace: Trace) -> TracedPlan:
    model = read(request, trace, _peer_tokens(request))
    defaults = resolve(model, trace)
    sized = size(defaults, trace)
    placed = place(sized, trace)
    plan = note_unwritten_buffers(request, report(sized, placed, trace), trace)
    return TracedPlan(plan, trace)


def _peer_tokens(request: PlanRequest) -> tuple[int, ...] | None:
    """With pipeline stages, every rank's own token capacity, each rank read, resolved and
    sized on its own (what it brings to SGLang's MIN all-reduce); else None."""
    engine = request.engine
    if engine is None or engine.pp_size == 1:
        return None
    tokens = []
    for rank in range(engine.pp_size):
        ranked = request.model_copy(
            update={"engine": engine.model_copy(update={"pp_rank": rank})})
        tokens.append(offered_tokens(resolve(read(ranked, Trace()), Trace())))
    return tuple(tokens)
