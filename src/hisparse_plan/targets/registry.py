"""The engines a request may name, each planned by a target package of its own. Adding an
engine is a package under targets/ with a `plan(request)`, a `plan_traced(request)` and the
titles of its stages, and one line in `TARGETS`."""

from __future__ import annotations

from collections.abc import Mapping
from importlib import import_module
from types import MappingProxyType
from typing import Final, Protocol, cast

from hisparse_plan.errors import UnsupportedRequestError
from hisparse_plan.models import KVCachePlan, PlanRequest
from hisparse_plan.models.any_plan import Plan, expect_plan
from hisparse_plan.models.engines import DEFAULT_ENGINE
from hisparse_plan.models.entry_input import request_argument
from hisparse_plan.targets.trace import Trace


class Traced(Protocol):
    """A plan with the decisions each stage made on the way (what `explain` renders)."""

    @property
    def plan(self) -> Plan: ...

    @property
    def trace(self) -> Trace: ...


class Target(Protocol):
    """What a target package offers the rest of the library."""

    STAGE_TITLES: Mapping[str, str]
    """Each stage's name in the trace -> a title for its decisions, in the order they run."""

    def plan(self, request: PlanRequest) -> Plan:
        """The engine's own plan for a validated request that names this engine."""
        ...

    def plan_traced(self, request: PlanRequest) -> Traced:
        """The same plan with every stage's decisions and their reasons."""
        ...


TARGETS: Final[Mapping[str, str]] = MappingProxyType({
    "vllm": "hisparse_plan.targets.vllm",
    "sglang": "hisparse_plan.targets.sglang",
})
"""Engine name -> the package that plans for it, imported when first picked."""



def engine_name(request: PlanRequest) -> str:
    """The engine `request` is for."""
    return DEFAULT_ENGINE if request.engine is None else request.engine.name


def target(name: str) -> Target:
    """The target of the engine called `name`."""
    try:
        package = TARGETS[name]
    except KeyError:
        raise UnsupportedRequestError(
            f"engine: expected one of {', '.join(TARGETS)}, got {name!r}") from None
    return cast(Target, import_module(package))


def plan_for_engine(request: PlanRequest | Mapping[str, object] | str | bytes) -> Plan:
    """The plan of the engine the request names: vLLM's `KVCachePlan` without `engine`,
    SGLang's `SGLangPlan` with `engine.name` "sglang". A mapping or JSON text is validated
    first."""
    validated = request_argument(request, "plan_for_engine")
    return target(engine_name(validated)).plan(validated)


def plan(request: PlanRequest | Mapping[str, object] | str | bytes) -> KVCachePlan:
    """The default engine's plan, vLLM's `KVCachePlan` (`hisparse_plan.plan`). A mapping or JSON
    text is validated first; a request that names another engine is refused, naming
    plan_for_engine."""
    validated = request_argument(request, "plan")
    return expect_plan(KVCachePlan, target(DEFAULT_ENGINE).plan(validated), "plan")
