"""`plan()`: a request flows through named stages, each handing a finished value to the next.

    group ─▶ size ─▶ admit ─▶ place ─▶ report        (SPEC 7.3 / 5.2-5.6, 5.7-5.8 / 7.4-7.6,
                                                      5.12 / 7.7-7.8, 5.9 / 7.5, 5.10 / 7.9)

The regular path (section 7) and the HiSparse path (section 5) run the same stages; HiSparse
adds the source, indexer, resident and hot groups on top of the regular grouping, and a host
pool. The order of the refusals differs as the SPEC orders them (5.12, 7.5).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final
from warnings import warn

from hisparse_plan.errors import PlanWarning, UnsupportedRequestError
from hisparse_plan.models import (
    Capacity,
    DevicePool,
    HisparseConfig,
    HostPool,
    KVCachePlan,
    KVCacheTensor,
    LayerSpec,
    PlanRequest,
    Workload,
    spec_key,
)
from hisparse_plan.models.base import built_for
from hisparse_plan.models.entry_input import request_argument
from hisparse_plan.models.pools import Pool, stage_pool_name
from hisparse_plan.rules.arith import require_int64
from hisparse_plan.targets.trace import Trace
from hisparse_plan.targets.vllm.admit import Admission, admit, group_required
from hisparse_plan.targets.vllm.groups import Layer, PlannedGroup
from hisparse_plan.targets.vllm.hisparse_groups import hisparse_groups
from hisparse_plan.targets.vllm.host_pool import longest_request_for_host, plan_host_pool
from hisparse_plan.targets.vllm.kv_sharing import allocating_request, with_sharing
from hisparse_plan.targets.vllm.one_manager import one_manager_layers
from hisparse_plan.targets.vllm.place import check_placeable, place_pool
from hisparse_plan.targets.vllm.platform.contracts import (
    check_stride_contracts,
    stride_contracts,
)
from hisparse_plan.targets.vllm.regular_groups import regular_groups
from hisparse_plan.targets.vllm.rules.block_bytes import check_layout
from hisparse_plan.targets.vllm.rules.capacity import hisparse_capacity, regular_capacity
from hisparse_plan.targets.vllm.size import StageSizing, size_stages

LOG = logging.getLogger("hisparse_plan")
"""The library's logger: a one-line summary per plan at INFO; nothing is printed."""
STAGE_TITLES: Final[Mapping[str, str]] = MappingProxyType({
    "pages": "pages (see docs/planning-rules.md#pages)",
    "group": "groups (see docs/planning-rules.md#hisparse-groups, #grouping)",
    "size": "pools: host and device (see docs/planning-rules.md#host-pool, #device-pool, "
    "#pipeline-stages)",
    "admit": "admission (see docs/planning-rules.md#admission, #auto-fit)",
    "place": "tensors (see docs/planning-rules.md#placement)",
    "report": "capacity (see docs/planning-rules.md#capacity)",
})
"""One section of `explain` per stage, in the order the stages run."""


@dataclass(frozen=True, slots=True)
class TracedPlan:
    plan: KVCachePlan
    trace: Trace


def plan(request: PlanRequest | Mapping[str, object] | str | bytes) -> KVCachePlan:
    """Decide groups, pools, strides and offsets for `request`.

    A mapping, or its JSON text, is validated first (pydantic's ValidationError for a malformed
    one; a path, a preset or a CLI spelling of a field is a PlanError saying what to pass); a
    request that cannot be planned raises `PlanError`.
    """
    validated = _validated(request)
    with built_for(None, "the plan"):  # models built from a valid request: PlanError only
        return _run(validated, Trace()).plan


def plan_traced(request: PlanRequest | Mapping[str, object] | str | bytes) -> TracedPlan:
    """The plan with every stage's decisions and their reasons."""
    validated = _validated(request)
    with built_for(None, "the plan"):
        return _run(validated, Trace(enabled=True))


def _validated(request: PlanRequest | Mapping[str, object] | str | bytes) -> PlanRequest:
    return request_argument(request, "plan")


def _run(request: PlanRequest, trace: Trace) -> TracedPlan:
    if request.engine is not None:
        raise UnsupportedRequestError(
            f"the request is for {request.engine.name}, whose pools plan() (vLLM's planner) "
            "does not lay out; expected plan_for_engine(request) (see "
            "docs/planning-rules.md#sglang)",
            field="engine",
        )
    request, sharing = allocating_request(request, trace)
    layers = request_layers(request)
    if request.scheduler.disable_hybrid_kv_cache_manager:
        layers = one_manager_layers(layers, trace)
    if trace.enabled:
        _trace_pages(layers, trace)
    if request.hisparse is None:
        result = _plan_regular(request, layers, trace)
    else:
        result = _plan_hisparse(request, request.hisparse, layers, trace)
    result = with_sharing(result, sharing)
    # The kernels' stride rules every GPU's backends hold (targets/vllm/platform/contracts.py).
    check_stride_contracts(result, request, stride_contracts(request, None))
    for note in result.warnings:
        warn(note, PlanWarning, stacklevel=4)
    if LOG.isEnabledFor(logging.INFO):
        LOG.info("%s", summary(result))
    return TracedPlan(result, trace)


def summary(plan: KVCachePlan) -> str:
    """One line: groups, pools, blocks and concurrency."""
    pools = " + ".join(f"{pool.size} B" for pool in plan.device_pools)
    host = "" if plan.host_pool is None else (
        f", host pool {plan.host_pool.size} B ({plan.host_pool.num_blocks} blocks"
        f"{', block-outermost' if plan.host_pool.layout.block_outermost else ''})")
    fitted = "" if plan.fitted_max_model_len is None else (
        f", max_model_len fitted to {plan.fitted_max_model_len}")
    return (
        f"planned {len(plan.groups)} groups in {len(plan.device_pools)} device pool(s) of "
        f"{pools} ({plan.num_blocks} blocks){host}{fitted}; max concurrency "
        f"{plan.capacity.max_concurrency:.4g}"
    )


def request_layers(request: PlanRequest) -> list[Layer]:
    """The layers in request order, equal specs as one object (grouping compares identity)."""
    canonical: dict[tuple[object, ...], LayerSpec] = {}
    # Validation already shares one object among equal layer inputs: key each object once.
    objects = {id(spec): spec for spec in request.layers.values()}
    one_of = {ident: canonical.setdefault(spec_key(spec), spec) for ident, spec in objects.items()}
    return [(name, one_of[id(spec)]) for name, spec in request.layers.items()]


def _trace_tensor(index: int, tensor: KVCacheTensor, stage: int, trace: Trace) -> None:
    if not trace.enabled:
        return
    where = "host pool" if tensor.host_resident else f"stage {stage} device pool"
    layers = f"{tensor.layers[0]!r}" + (
        f" and {len(tensor.layers) - 1} more" if len(tensor.layers) > 1 else "")
    for field in ("offset", "layer_stride", "block_stride"):
        trace.add("place", "5.9 / 7.5", f"tensors[{index}].{field}", getattr(tensor, field),
                  f"{field} of {layers} in the {where} ({tensor.size} bytes)")


def _trace_groups(groups: list[PlannedGroup], trace: Trace) -> None:
    for index, planned in enumerate(groups):
        group = planned.group
        trace.add("group", "5.6 / 7.3", f"groups[{index}]", group.spec.kind,
                  f"{len(group.layer_names)} layer(s) from {group.layer_names[0]!r}, block_size "
                  f"{group.spec.block_size}, page {group.spec.page_size_bytes}, role {group.role}")


def _trace_pages(layers: list[Layer], trace: Trace) -> None:
    """One page per distinct spec (SPEC 5.1, 7.1)."""
    first: dict[int, tuple[str, LayerSpec, int]] = {}
    for name, spec in layers:
        seen = first.get(id(spec))
        first[id(spec)] = (name, spec, 1) if seen is None else (seen[0], spec, seen[2] + 1)
    for name, spec, count in first.values():
        more = f" (and {count - 1} more like it)" if count > 1 else ""
        padded = spec.padded_page_bytes
        trace.add(
            "pages", "7.1", f"page of {name}{more}", spec.page_size_bytes,
            f"{spec.kind}: H {spec.heads} x N {spec.tokens_per_block} x C {spec.content_bytes} "
            f"= {spec.natural_page_bytes}" + ("" if padded is None else f", padded to {padded}"),
        )


def _workload(request: PlanRequest, **hisparse: int | None) -> Workload:
    scheduler = request.scheduler
    return Workload(
        max_model_len=request.model.max_model_len,
        max_num_batched_tokens=scheduler.max_num_batched_tokens,
        max_concurrent_batches=scheduler.max_concurrent_batches,
        num_prefill_lookahead_tokens=scheduler.num_prefill_lookahead_tokens,
        mamba_cache_mode=request.model.mamba_cache_mode,
        decode_context_parallel_size=scheduler.decode_context_parallel_size,
        **hisparse,
    )


def _plan_regular(request: PlanRequest, layers: list[Layer], trace: Trace) -> KVCachePlan:
    layout = request.device.kv_cache_layout
    groups = regular_groups(layers, layout, trace)
    if trace.enabled:
        _trace_groups(groups, trace)
    stages = size_stages(request.device, groups, layers, trace)
    for stage in stages:
        check_layout(stage.groups, layout, _stage_name(stage))
        check_placeable(stage.groups, layout, stage.bytes_per_block)
    workload = _workload(request)
    admission = admit(
        stages, groups, workload,
        auto_fit=request.model.auto_fit_max_model_len, longest_for_host=None, trace=trace,
    )
    capacity = regular_capacity(admission.num_blocks, admission.required)
    trace.add("report", "7.9", "capacity.max_concurrency", capacity.max_concurrency,
              lambda: f"num_blocks {admission.num_blocks} / {sum(admission.required)} blocks "
              f"per {admission.max_model_len}-token request")
    return _assemble(request, groups, stages, admission, workload, capacity, trace)


def _plan_hisparse(
    request: PlanRequest, hisparse: HisparseConfig, layers: list[Layer], trace: Trace
) -> KVCachePlan:
    layout = request.device.kv_cache_layout
    grouping = hisparse_groups(request, hisparse, layers, trace)
    if trace.enabled:
        _trace_groups([grouping.source, *grouping.device], trace)
    source = grouping.source
    source_page = source.group.spec.page_size_bytes
    stages = size_stages(request.device, grouping.device, layers, trace)
    workload = _workload(
        request, index_topk=request.model.index_topk, top_k=grouping.hot.top_k,
        device_buffer_size=grouping.hot.rows,
        max_decode_query_len=hisparse.max_decode_query_len,
    )
    admission = admit(
        stages, grouping.device, workload, auto_fit=request.model.auto_fit_max_model_len,
        longest_for_host=longest_request_for_host(source_page, hisparse, grouping.block_size),
        trace=trace,
    )
    host = plan_host_pool(
        source_page, hisparse, admission.max_model_len, grouping.block_size, trace
    )
    check_layout(stages[0].groups, layout, "the device groups")
    host_tensors = place_pool(
        [source.buckets], host.layout, host.num_blocks, host.bytes_per_block,
        host_resident=True, pool=stage_pool_name("host", 0, 1),
    )
    for index, tensor in enumerate(host_tensors):
        _trace_tensor(index, tensor, 0, trace)
    capacity = hisparse_capacity(
        admission.num_blocks,
        [group.group.spec for group in grouping.device],
        admission.required,
        host.num_blocks,
        group_required(source, admission.max_model_len, workload),
    )
    trace.add("report", "5.10", "capacity.max_concurrency", capacity.max_concurrency,
              lambda: f"min(num_blocks {admission.num_blocks} / {sum(admission.required)} device "
              f"blocks per request, host blocks {host.num_blocks} / "
              f"{group_required(source, admission.max_model_len, workload)} per request)")
    trace.add("report", "5.10", "capacity.steady_state_concurrency",
              capacity.steady_state_concurrency or 0.0,
              lambda: "min(gpu bound with each resident group capped at its last 2 pages, "
              "host bound)")
    return _assemble(
        request, [source, *grouping.device], stages, admission, workload, capacity, trace,
        host=host, host_tensors=host_tensors, warnings=grouping.hot.warnings,
    )


def _assemble(
    request: PlanRequest,
    groups: list[PlannedGroup],
    stages: list[StageSizing],
    admission: Admission,
    workload: Workload,
    capacity: Capacity,
    trace: Trace,
    *,
    host: HostPool | None = None,
    host_tensors: list[KVCacheTensor] | None = None,
    warnings: list[str] | None = None,
) -> KVCachePlan:
    """Place every stage with the admitted num_blocks and put the plan together."""
    device = request.device
    num_blocks = admission.num_blocks
    tensors = list(host_tensors or [])
    pools = []
    described = [] if host is None else [Pool(
        name=stage_pool_name("host", 0, 1), location="host", allocation="whole", size=host.size,
        num_blocks=host.num_blocks, block_tokens=None, padding_blocks=1, shared=host.shared,
    )]
    for stage in stages:
        name = stage_pool_name("device", stage.index, len(stages))
        size = require_int64(
            stage.bytes_per_block * num_blocks, f"the device pool of stage {stage.index}",
            field="device.num_blocks_override",
        )
        placed = place_pool(
            stage.groups, device.kv_cache_layout, num_blocks, stage.bytes_per_block, pool=name
        )
        for tensor in placed:
            _trace_tensor(len(tensors), tensor, stage.index, trace)
            tensors.append(tensor)
        trace.add("size", "5.8 / 7.6", f"device_pools[{stage.index}].size", size,
                  f"bytes_per_block {stage.bytes_per_block} * num_blocks {num_blocks}")
        pools.append(DevicePool(
            layout=device.kv_cache_layout,
            bytes_per_block=stage.bytes_per_block,
            size=size,
            available_bytes=stage.available_bytes,
            num_blocks_override=device.num_blocks_override,
            layers=stage.layers,
        ))
        described.append(Pool(
            name=name, location="device", stage=stage.index, allocation="whole", size=size,
            num_blocks=num_blocks, block_tokens=None, padding_blocks=1,
        ))
    return KVCachePlan(
        pools=described,
        num_blocks=num_blocks,
        groups=[group.group for group in groups],
        tensors=tensors,
        host_pool=host,
        capacity=capacity,
        fitted_max_model_len=admission.fitted_max_model_len,
        device_pools=pools,
        workload=workload,
        warnings=list(warnings or []),
    )


def _stage_name(stage: StageSizing) -> str:
    return "the device groups" if stage.layers is None else f"the groups of stage {stage.index}"
