"""Cross-layer KV sharing as vLLM 0.34 allocates it (see
docs/planning-rules.md#cross-layer-kv-sharing).

vLLM's runner gives a layer with `kv_sharing_target_layer_name` no KV cache spec
(`get_kv_cache_spec` skips it), so it takes no group slot, no page and no byte of any block:
groups, pages, tokens and capacity follow from the allocating layers alone. After allocation it
binds the target's tensor to the sharing layer (`bind_kv_caches`) and lists the sharing layer
in the target's group for attention metadata only (`add_kv_sharing_layers_to_kv_cache_groups`,
on the runner's copy of the config, not the scheduler's). The plan plans the allocating layers
and records whose pages each sharing layer reads (`KVCachePlan.kv_sharing`).
"""

from __future__ import annotations

from hisparse_plan.errors import PlanError, UnsupportedRequestError
from hisparse_plan.models import DeviceConfig, KVCachePlan, PlanRequest
from hisparse_plan.models.base import FrozenDict, FrozenList
from hisparse_plan.models.kv_sharing import shared_layers
from hisparse_plan.targets.trace import Trace
from hisparse_plan.targets.vllm.size import check_stages

RULE = "7.14"


def allocating_request(request: PlanRequest, trace: Trace) -> tuple[PlanRequest, dict[str, str]]:
    """The request without its sharing layers (they allocate nothing), and sharing layer ->
    target. A request without sharing comes back as it is."""
    sharing = shared_layers(request.layers)
    if not sharing:
        return request, sharing
    first = next(iter(sharing))
    if request.hisparse is not None:
        raise UnsupportedRequestError(
            f"layers[{first!r}].kv_sharing_target: HiSparse beside cross-layer KV sharing is "
            "not planned (HiSparse derives resident and hot layers from each layer's own "
            "cache, which a sharing layer lacks); expected no kv_sharing_target with hisparse",
            field=f"layers[{first!r}].kv_sharing_target",
        )
    device = request.device
    if device.pipeline_stages is not None:
        check_stages(device, list(request.layers.items()))
        device = _stages_without(device, sharing)
    kept = {name: spec for name, spec in request.layers.items() if name not in sharing}
    for name, target in sharing.items():
        trace.add("group", RULE, f"kv_sharing[{name!r}]", target,
                  f"{name!r} reads {target!r}'s pages: no group slot and no page of its own "
                  "(vLLM's kv_sharing_target_layer_name)")
    update: dict[str, object] = {"layers": FrozenDict(kept), "device": device}
    return request.model_copy(update=update), sharing


def _stages_without(device: DeviceConfig, sharing: dict[str, str]) -> DeviceConfig:
    """Each stage's layers without the sharing ones, each of which must sit in its target's
    stage (the runner binds the target's tensor, which only that stage allocates)."""
    stages = device.pipeline_stages or []
    stage_of = {name: index for index, stage in enumerate(stages) for name in stage.layers}
    for name, target in sharing.items():
        if stage_of[name] != stage_of[target]:
            field = f"device.pipeline_stages[{stage_of[name]}].layers"
            raise PlanError(
                f"{field}: {name!r} reads {target!r}'s cache, which stage {stage_of[target]} "
                f"holds; expected both in one stage (see "
                "docs/planning-rules.md#cross-layer-kv-sharing)",
                field=field,
            )
    # A stage keeps its target with every sharing layer, so none is left without a layer.
    kept = [stage.model_copy(update={"layers": FrozenList(
        [name for name in stage.layers if name not in sharing])}) for stage in stages]
    return device.model_copy(update={"pipeline_stages": FrozenList(kept)})


def with_sharing(plan: KVCachePlan, sharing: dict[str, str]) -> KVCachePlan:
    """The plan of the allocating layers, recording whose pages each sharing layer reads."""
    if not sharing:
        return plan
    return plan.model_copy(update={"kv_sharing": FrozenDict(sharing)})
