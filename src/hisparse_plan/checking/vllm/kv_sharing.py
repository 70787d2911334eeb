"""Cross-layer KV sharing in a vLLM plan (docs/plan-contract.md#cross-layer-kv-sharing).

The one aliasing a plan may have beyond its groups' overlay at one block id: a layer of
`kv_sharing` reads its declared target's pages (its view is the target's, `views.shared_views`)
and has none of its own, so the page proof (`prove_disjoint`) never sees it, and any other two
layers that share a byte are still refused there. Here: a sharing layer is in no group, no
tensor and no stage list; its target is a placed device attention layer of a default group that
keeps its own pages; no group spec declares sharing; and, given the request, the sharing is the
request's, each target with the sharing layer's geometry.
"""

from __future__ import annotations

from collections.abc import Mapping

from hisparse_plan.errors import PlanInvariantError
from hisparse_plan.models import AttentionLayerSpec, GroupSpec, KVCachePlan, PlanRequest
from hisparse_plan.models.entry_input import request_argument
from hisparse_plan.models.kv_sharing import SHARING_FIELD, geometry, shared_layers, sharing_target


def check_kv_sharing(
    plan: KVCachePlan,
    specs: dict[str, tuple[int, GroupSpec]],
    request: PlanRequest | Mapping[str, object] | None,
) -> None:
    """Raise `PlanInvariantError` at the first broken rule of the module doc."""
    _check_no_group_declares(specs)
    for name, target in plan.kv_sharing.items():
        _check_pair(plan, specs, name, target)
    if request is not None:
        _check_against_request(plan, request_argument(request, "check_plan"))


def _check_no_group_declares(specs: dict[str, tuple[int, GroupSpec]]) -> None:
    """A group's layers keep pages: none of their specs may say it reads another's."""
    for name, (group, spec) in specs.items():
        target = sharing_target(spec)
        if target is not None:
            raise PlanInvariantError(
                f"groups[{group}] gives layer {name!r} a spec with {SHARING_FIELD} {target!r}; "
                "expected a layer that reads another's cache in kv_sharing, in no group",
                layer=name,
            )


def _check_pair(
    plan: KVCachePlan, specs: dict[str, tuple[int, GroupSpec]], name: str, target: str
) -> None:
    where = f"kv_sharing[{name!r}]"
    if name in specs:
        raise PlanInvariantError(
            f"{where}: {name!r} reads {target!r}'s pages, but groups[{specs[name][0]}] lists "
            "it too; expected a sharing layer in no group and no tensor (it has no pages)",
            layer=name,
        )
    if target in plan.kv_sharing:
        raise PlanInvariantError(
            f"{where} names {target!r}, which itself reads {plan.kv_sharing[target]!r}'s "
            "pages; expected a layer that keeps its own",
            layer=name,
        )
    found = specs.get(target)
    if found is None:
        raise PlanInvariantError(
            f"{where} names {target!r}, which no group lists; expected a layer the plan places",
            layer=name,
        )
    group, spec = found
    role = plan.groups[group].role
    if role != "default" or not isinstance(spec, AttentionLayerSpec):
        raise PlanInvariantError(
            f"{where} names {target!r}, a {spec.kind} layer of groups[{group}] ({role}); "
            "expected an attention layer of a default group (vLLM shares attention caches "
            "only)",
            layer=name,
        )


def _check_against_request(plan: KVCachePlan, request: PlanRequest) -> None:
    """The plan shares what the request declares, each target of the reader's geometry in the
    request (the plan's own specs may be padded or promoted by the planner)."""
    wanted = shared_layers(request.layers)
    for name, target in plan.kv_sharing.items():
        mine, theirs = request.layers.get(name), request.layers.get(target)
        if mine is None or theirs is None:
            missing = name if mine is None else target
            raise PlanInvariantError(
                f"kv_sharing[{name!r}] is {target!r}, but the request has no layer "
                f"{missing!r}; expected layers of the request",
                layer=name,
            )
        mine_fields, theirs_fields = geometry(mine), geometry(theirs)
        if type(mine) is not type(theirs) or mine_fields != theirs_fields:
            field = next((key for key in mine_fields
                          if mine_fields[key] != theirs_fields.get(key)), "kind")
            raise PlanInvariantError(
                f"kv_sharing[{name!r}] names {target!r}, whose pages have {field} "
                f"{theirs_fields.get(field)!r}; the request's {name!r} has "
                f"{mine_fields.get(field)!r}: expected a target of the reader's geometry",
                layer=name,
            )
        declared = wanted.get(name)
        if declared != target:
            said = "declares none" if declared is None else f"declares {declared!r}"
            raise PlanInvariantError(
                f"kv_sharing[{name!r}] is {target!r}; the request {said} (layers[{name!r}]."
                f"{SHARING_FIELD})",
                layer=name,
            )
    undeclared = next((name for name in wanted if name not in plan.kv_sharing), None)
    if undeclared is not None:
        raise PlanInvariantError(
            f"the request's layer {undeclared!r} reads {wanted[undeclared]!r}'s cache; "
            f"expected kv_sharing[{undeclared!r}] in the plan",
            layer=undeclared,
        )
