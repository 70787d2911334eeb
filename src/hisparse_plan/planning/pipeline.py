"""`plan()`: a request flows through named stages, each handing a finished value to the next.

    group ─▶ size ─▶ admit ─▶ place ─▶ report        (SPEC 7.3 / 5.2-5.6, 5.7-5.8 / 7.4-7.6,
                                                      5.12 / 7.7-7.8, 5.9 / 7.5, 5.10 / 7.9)

The regular path (section 7) and the HiSparse path (section 5) run the same stages; HiSparse
adds the source, indexer, resident and hot groups on top of the regular grouping, and a host
pool. The order of the refusals differs as the SPEC orders them (5.12, 7.5).
"""

from __future__ import annotations

from warnings import warn
from collections.abc import Mapping
from dataclasses import dataclass

from hisparse_plan.errors import PlanWarning
from hisparse_plan.models import (
    Capacity,
    LayerSpec,
    DevicePool,
    HostPool,
    KVCacheTensor,
    HisparseConfig,
    KVCacheLayout,
    KVCachePlan,
    PlanRequest,
    Workload,
    spec_key,
)
from hisparse_plan.planning.admit import Admission, admit, group_required
from hisparse_plan.planning.groups import Layer, PlannedGroup
from hisparse_plan.planning.hisparse_groups import hisparse_groups
from hisparse_plan.planning.host_pool import longest_request_for_host, plan_host_pool
from hisparse_plan.planning.place import check_placeable, place_pool
from hisparse_plan.planning.regular_groups import regular_groups
from hisparse_plan.planning.size import StageSizing, size_stages
from hisparse_plan.planning.trace import Trace
from hisparse_plan.rules.arith import require_int64
from hisparse_plan.rules.block_bytes import check_layout
from hisparse_plan.rules.capacity import hisparse_capacity, regular_capacity


@dataclass(frozen=True, slots=True)
class TracedPlan:
    plan: KVCachePlan
    trace: Trace


def plan(request: PlanRequest | Mapping[str, object]) -> KVCachePlan:
    """Decide groups, pools, strides and offsets for `request`.

    A mapping is validated first (pydantic's ValidationError for a malformed one); a request
    that cannot be planned raises `PlanError`.
    """
    return _run(_validated(request), Trace()).plan


def plan_traced(request: PlanRequest | Mapping[str, object]) -> TracedPlan:
    """The plan with every stage's decisions and their reasons."""
    return _run(_validated(request), Trace(enabled=True))


def _validated(request: PlanRequest | Mapping[str, object]) -> PlanRequest:
    return request if isinstance(request, PlanRequest) else PlanRequest.model_validate(request)


def _run(request: PlanRequest, trace: Trace) -> TracedPlan:
    layers = request_layers(request)
    if trace.enabled:
        _trace_pages(layers, trace)
    if request.hisparse is None:
        result = _plan_regular(request, layers, trace)
    else:
        result = _plan_hisparse(request, request.hisparse, layers, trace)
    for note in result.warnings:
        warn(note, PlanWarning, stacklevel=4)
    return TracedPlan(result, trace)


def request_layers(request: PlanRequest) -> list[Layer]:
    """The layers in request order, equal specs as one object (grouping compares identity)."""
    canonical: dict[int, object] = {}
    by_key: dict[tuple[object, ...], object] = {}
    layers: list[Layer] = []
    for name, spec in request.layers.items():
        same = canonical.get(id(spec))
        if same is None:
            same = canonical[id(spec)] = by_key.setdefault(spec_key(spec), spec)
        layers.append((name, same))  # type: ignore[arg-type]
    return layers


def _trace_groups(groups: list[PlannedGroup], trace: Trace) -> None:
    for index, planned in enumerate(groups):
        group = planned.group
        trace.add("group", "5.6 / 7.3", f"groups[{index}]", group.spec.kind,
                  lambda g=group: f"{len(g.layer_names)} layer(s) from {g.layer_names[0]!r}, "
                  f"block_size {g.spec.block_size}, page {g.spec.page_size_bytes}, role {g.role}")


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
            lambda s=spec, p=padded: f"{s.kind}: H {s.heads} x N {s.tokens_per_block} x C "
            f"{s.content_bytes} = {s.natural_page_bytes}"
            + ("" if p is None else f", padded to {p}"),
        )


def _workload(request: PlanRequest, **hisparse: int | None) -> Workload:
    scheduler = request.scheduler
    return Workload(
        max_model_len=request.model.max_model_len,
        max_num_batched_tokens=scheduler.max_num_batched_tokens,
        max_concurrent_batches=scheduler.max_concurrent_batches,
        num_prefill_lookahead_tokens=scheduler.num_prefill_lookahead_tokens,
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
        request, top_k=grouping.hot.top_k, device_buffer_size=grouping.hot.rows,
        max_decode_query_len=hisparse.max_decode_query_len,
    )
    admission = admit(
        stages, grouping.device, workload, auto_fit=False,
        longest_for_host=longest_request_for_host(source_page, hisparse, grouping.block_size),
        trace=trace,
    )
    host = plan_host_pool(
        source_page, hisparse, workload.max_model_len, grouping.block_size, trace
    )
    check_layout(stages[0].groups, layout, "the device groups")
    host_tensors = place_pool(
        [source.buckets], KVCacheLayout.LBNHC, host.num_blocks, host.bytes_per_block,
        host_resident=True,
    )
    capacity = hisparse_capacity(
        admission.num_blocks,
        [group.group.spec for group in grouping.device],
        admission.required,
        host.num_blocks,
        group_required(source, admission.max_model_len, workload),
    )
    trace.add("report", "5.10", "capacity", capacity,
              lambda: f"device {admission.num_blocks} blocks / {sum(admission.required)} per "
              f"request, host {host.num_blocks} blocks")
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
    for stage in stages:
        placed = place_pool(
            stage.groups, device.kv_cache_layout, num_blocks, stage.bytes_per_block
        )
        for tensor in placed:
            trace.add("place", "5.9 / 7.5", f"tensors[{len(tensors)}] {tensor.layers[0]}"
                      + (f" (+{len(tensor.layers) - 1})" if len(tensor.layers) > 1 else ""),
                      tensor.offset,
                      lambda t=tensor, st=stage: f"stage {st.index}: offset {t.offset}, "
                      f"layer_stride {t.layer_stride}, block_stride {t.block_stride}, pool "
                      f"{t.size} bytes")
            tensors.append(tensor)
        size = require_int64(
            stage.bytes_per_block * num_blocks, f"the device pool of stage {stage.index}",
            field="device.num_blocks_override",
        )
        pools.append(DevicePool(
            layout=device.kv_cache_layout,
            bytes_per_block=stage.bytes_per_block,
            size=size,
            available_bytes=stage.available_bytes,
            num_blocks_override=device.num_blocks_override,
            layers=stage.layers,
        ))
    return KVCachePlan(
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
    return "the device groups" if stage.layers is None else f"pipeline stage {stage.index}"
