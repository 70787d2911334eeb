"""`check_plan`: prove any engine's plan sound and, given its request, that it answers it.
May import models, rules, views and targets (vLLM's rules, `plan_for_engine`)."""

from __future__ import annotations

from collections.abc import Mapping

from hisparse_plan.checking.engines import CHECKERS
from hisparse_plan.errors import PlanError, PlanInvariantError
from hisparse_plan.models import PlanRequest
from hisparse_plan.models.any_plan import Plan, load_plan

__all__ = ["check_plan"]


def check_plan(
    plan: Plan | Mapping[str, object],
    *,
    request: PlanRequest | Mapping[str, object] | None = None,
) -> None:
    """Raise `PlanInvariantError` at the first broken invariant; return None for a sound plan.

    From the plan alone: placement, the meaning of every group, every derived number, and
    that no two pages share a byte they may not. With `request`, also that the plan is the one
    the request gives, naming the first field that differs. A mapping is validated first.

    Cost grows with layers and tensors, never with num_blocks, heads or page sizes: a
    10,000-layer plan with a million blocks is proved as fast as one with a single block.
    """
    plan = load_plan(plan)
    try:
        CHECKERS[type(plan)](plan, request)
    except PlanInvariantError:
        raise
    except PlanError as error:
        # A rule shared with the planner refused part of the plan; callers catch
        # PlanInvariantError for every broken invariant.
        raise PlanInvariantError(str(error)) from error
    except (IndexError, KeyError, ZeroDivisionError, OverflowError) as error:
        # Every rule bounds what it indexes first; should one still meet a plan inconsistent
        # in a way no earlier rule caught, the caller gets a refusal, not an internal error.
        raise PlanInvariantError(
            f"the plan is inconsistent where check_plan reads it ({type(error).__name__}: "
            f"{str(error)[:120]}); expected a plan the planner could have written") from error
