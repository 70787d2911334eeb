"""Either engine's plan, picked by its `engine` field."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from hisparse_plan.errors import PlanError
from hisparse_plan.models.engines import SGLANG, SGLangPlan
from hisparse_plan.models.entry_input import refuse_path
from hisparse_plan.models.json_input import MAX_DEPTH, load_json_object
from hisparse_plan.models.plan import KVCachePlan

Plan = KVCachePlan | SGLangPlan
"""A plan of either engine: vLLM's (`KVCachePlan`) or SGLang's (`SGLangPlan`)."""


def load_plan(data: Plan | Mapping[str, object] | str | bytes) -> Plan:
    """A plan from its JSON text or dict: `engine` "sglang" gives an `SGLangPlan`, anything
    else (a version 1 plan has no `engine`) a `KVCachePlan`. JSON text is read strictly: a key
    named twice, or nesting past MAX_DEPTH, is refused. A path (a Path, or a string naming a
    .json file) is refused saying so: read the file and pass its text."""
    if isinstance(data, KVCachePlan | SGLangPlan):
        return data
    refuse_path(data, "load_plan", "a plan (a dict)")
    if isinstance(data, str | bytes):
        try:
            data = load_json_object(data, what="plan", max_depth=MAX_DEPTH)
        except PlanError as error:
            raise PlanError(f"expected a plan's JSON text: {error}", field=error.field
                            ) from None
    if not isinstance(data, Mapping):
        raise PlanError(f"expected a plan (a JSON object), got {type(data).__name__}")
    # A parsed dict is validated as it is: a copy of two million keys is 100 MB.
    plain = data if type(data) is dict else dict(data)
    if plain.get("engine") == SGLANG:
        return SGLangPlan.model_validate(plain)
    return KVCachePlan.model_validate(plain)


_KINDS: dict[type[object], str] = {
    KVCachePlan: "a vLLM plan (KVCachePlan)",
    SGLangPlan: "an SGLang plan (SGLangPlan)",
}
PlanT = TypeVar("PlanT", KVCachePlan, SGLangPlan)


def expect_plan(kind: type[PlanT], plan: object, where: str) -> PlanT:
    """`plan` when it is `kind`, the plan one engine's function reads; the other engine's plan
    (or anything else) is a PlanError saying which was expected, never an AttributeError from
    a field the other plan lacks."""
    if isinstance(plan, kind):
        return plan
    got = _KINDS.get(type(plan), type(plan).__name__)
    raise PlanError(f"{where}: expected {_KINDS[kind]}, got {got}")
