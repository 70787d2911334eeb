"""Pipeline stages: which device pool an allocation holds, and which layer views belong to it.

A plan with pipeline stages has one device pool per stage (`plan.device_pools`), each on its
own GPU in its own process. The backend allocates one stage at a time, so every question about
a layer first asks whether its pages lie in the stage at hand; a layer of another stage is
refused by name rather than bound into the wrong pool.
"""

from __future__ import annotations

from hisparse_plan.models import KVCachePlan
from hisparse_plan.torch.errors import BackendError
from hisparse_plan.views import LayerView, plan_views, shared_views


def resolve_stage(plan: KVCachePlan, stage: int | None) -> int:
    """The stage index to allocate: `stage` checked against the plan's stages. None stands
    for the only stage of a one-stage plan and is refused for a pipelined plan."""
    count = len(plan.device_pools)
    if stage is None:
        if count == 1:
            return 0
        raise BackendError(
            f"the plan has {count} pipeline stages, each with its own device pool "
            f"(device_pools); expected stage= naming the one to allocate, 0 to {count - 1}"
        )
    if isinstance(stage, bool) or not isinstance(stage, int):
        raise BackendError(f"stage is {stage!r}; expected an integer stage index or None")
    if not 0 <= stage < count:
        expected = "0 (or None)" if count == 1 else f"0 to {count - 1}"
        raise BackendError(
            f"stage is {stage}, but the plan has {count} pipeline "
            f"stage{'s' if count != 1 else ''}; expected {expected}"
        )
    return stage


def in_stage(view: LayerView, stage: int) -> bool:
    """Whether the view's pages lie in the pools of `stage`: its device pool, or the host
    pool (which only one-stage plans have)."""
    return view.host_resident or view.stage == stage


def stage_views(plan: KVCachePlan, stage: int) -> dict[str, LayerView]:
    """The views of every layer whose pages lie in the pools of `stage`, in plan order, then
    those of the layers that read another layer's pages (`plan.kv_sharing`): each its
    target's view."""
    views = plan_views(plan)
    every = {**views, **shared_views(plan, views)} if plan.kv_sharing else views
    return {name: view for name, view in every.items() if in_stage(view, stage)}


def refuse_layer(plan: KVCachePlan, name: str, stage: int) -> BackendError:
    """The error for asking the pools of `stage` for layer `name`: which stage holds it, or
    that no tensor of the plan places it."""
    view = plan_views(plan).get(name)
    if view is None:
        return BackendError(f"layer {name!r} is not placed by any tensor of the plan; expected "
                            "one of the layers of plan.tensors")
    return BackendError(
        f"layer {name!r} belongs to pipeline stage {view.stage}, but these pools hold stage "
        f"{stage}'s device pool; expected a layer of stage {stage}, or allocate(plan, "
        f"stage={view.stage}) for this one"
    )
