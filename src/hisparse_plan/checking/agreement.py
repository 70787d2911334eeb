"""A plan answers a request: it is, field for field, the plan the request gives.

The one check that plans again: what a request asks for (its layer order, its settings) is not
recorded in a plan, so only planning the request shows what the answer must be.
"""

from __future__ import annotations

from collections.abc import Mapping

from hisparse_plan.errors import PlanError, PlanInvariantError
from hisparse_plan.models import PlanRequest
from hisparse_plan.models.any_plan import Plan
from hisparse_plan.targets import plan_for_engine


def check_answers(plan: Plan, request: PlanRequest | Mapping[str, object]) -> None:
    """Refuse a plan that differs from what `request` plans to (for the engine it names),
    naming the first field."""
    try:
        expected = plan_for_engine(request)
    except PlanError as error:
        raise PlanInvariantError(
            f"the request is refused ({error}), so no plan answers it"
        ) from error
    found = first_difference(
        plan.model_dump(mode="json"), expected.model_dump(mode="json"), "plan"
    )
    if found is not None:
        path, got, want = found
        raise PlanInvariantError(
            f"{path} is {_short(got)}; the request gives {_short(want)}"
        )


def first_difference(got: object, want: object, path: str) -> tuple[str, object, object] | None:
    """The first path (depth first, in field order) where two JSON values differ."""
    if isinstance(got, dict) and isinstance(want, dict):
        for key in list(want) + [k for k in got if k not in want]:
            if key not in got or key not in want:
                return f"{path}.{key}", got.get(key, "(missing)"), want.get(key, "(missing)")
            found = first_difference(got[key], want[key], f"{path}.{key}")
            if found is not None:
                return found
        return None
    if isinstance(got, list) and isinstance(want, list):
        for index, (a, b) in enumerate(zip(got, want, strict=False)):
            found = first_difference(a, b, f"{path}[{index}]")
            if found is not None:
                return found
        if len(got) != len(want):
            return f"{path} (length)", len(got), len(want)
        return None
    return None if got == want else (path, got, want)


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."
