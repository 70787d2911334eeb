"""The checker of each engine's plan type: the one place in checking/ that knows which engines
there are. A new engine's plan type adds its checker here."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from hisparse_plan.checking.sglang import check_sglang_plan
from hisparse_plan.checking.vllm import check_vllm_plan
from hisparse_plan.models import KVCachePlan, PlanRequest
from hisparse_plan.models.sglang_plan import SGLangPlan

Checker = Callable[[Any, PlanRequest | Mapping[str, object] | None], None]
"""Proves one plan type sound: raises `PlanInvariantError` at its first broken invariant."""

CHECKERS: Final[Mapping[type, Checker]] = {
    KVCachePlan: check_vllm_plan,
    SGLangPlan: check_sglang_plan,
}
"""Plan type -> its checker."""
