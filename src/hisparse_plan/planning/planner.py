"""`plan()`: a request in, a finished plan out; pure and deterministic (SPEC section 5)."""

from __future__ import annotations

import warnings
from collections.abc import Mapping

from hisparse_plan.errors import PlanError, PlanWarning
from hisparse_plan.models import (
    HOT_SUFFIX,
    RESIDENT_SUFFIX,
    DevicePool,
    GroupRole,
    HisparseConfig,
    HisparseHotSpec,
    HisparseResidentSpec,
    KVCacheGroup,
    KVCacheLayout,
    KVCachePlan,
    MLASpec,
    PlanRequest,
    Workload,
)
from hisparse_plan.planning.arith import ceil_div, require_int64
from hisparse_plan.planning.buckets import (
    LayerRun,
    PlacedGroup,
    SpecBucket,
    members,
    uniform_spec,
)
from hisparse_plan.planning.capacity import hisparse_capacity
from hisparse_plan.planning.grouping import HisparseLayers, split_layers
from hisparse_plan.planning.hot import HotPack, hot_buffer_rows, hot_packs
from hisparse_plan.planning.pools import (
    device_bytes_per_block,
    device_num_blocks,
    plan_host_pool,
)
from hisparse_plan.planning.tensors import group_tensors


def plan(request: PlanRequest | Mapping[str, object]) -> KVCachePlan:
    """Decide groups, pools, strides and offsets for `request`.

    A mapping is validated first (pydantic's ValidationError for a malformed one); a request
    that cannot be planned raises `PlanError`.
    """
    if not isinstance(request, PlanRequest):
        request = PlanRequest.model_validate(request)
    layers = split_layers(request)
    if request.hisparse is None:  # split_layers refuses it; this narrows the type
        raise PlanError("hisparse settings are required", field="hisparse")
    return _plan_hisparse(request, request.hisparse, layers)


def _plan_hisparse(
    request: PlanRequest, hisparse: HisparseConfig, layers: HisparseLayers
) -> KVCachePlan:
    block_size = layers.block_size
    source_specs = [b.spec for b in layers.source_buckets if isinstance(b.spec, MLASpec)]
    rows, notes = hot_buffer_rows(source_specs, request.model, hisparse, block_size)
    indexer_page = sum(bucket.block_bytes for bucket in layers.indexer_buckets)
    packs = hot_packs(layers.source_runs, indexer_page)

    source = _uniform_group(layers.source_runs, layers.source_buckets, "hisparse_source")
    indexer = _uniform_group(layers.indexer_runs, layers.indexer_buckets, "hisparse_indexer")
    resident_specs, hot_specs = _derived_specs(packs, block_size, ceil_div(rows, block_size))
    device_groups = [
        indexer,
        *(_derived_group(pack, RESIDENT_SUFFIX, resident_specs[pack.page]) for pack in packs),
        *(_derived_group(pack, HOT_SUFFIX, hot_specs[pack.page]) for pack in packs),
    ]
    if layers.regular is not None:
        device_groups.append(layers.regular)

    workload = Workload(
        max_model_len=request.model.max_model_len,
        max_num_batched_tokens=request.scheduler.max_num_batched_tokens,
        max_concurrent_batches=request.scheduler.max_concurrent_batches,
    )
    host_pool = plan_host_pool(
        source.group.spec.page_size_bytes, hisparse, workload.max_model_len, block_size
    )
    device = request.device
    layout = device.kv_cache_layout
    bytes_per_block = device_bytes_per_block(device_groups, layout)
    num_blocks = device_num_blocks(
        device.available_bytes, bytes_per_block, device.num_blocks_override
    )
    device_size = require_int64(
        bytes_per_block * num_blocks, "the device pool", field="device.num_blocks_override"
    )

    tensors = group_tensors(
        source, KVCacheLayout.LBNHC, host_pool.num_blocks, host_pool.bytes_per_block,
        host_pool.size,
    )
    for group in device_groups:
        tensors += group_tensors(group, layout, num_blocks, bytes_per_block, device_size)

    for note in notes:
        warnings.warn(note, PlanWarning, stacklevel=3)
    return KVCachePlan(
        num_blocks=num_blocks,
        groups=[source.group, *(group.group for group in device_groups)],
        tensors=tensors,
        host_pool=host_pool,
        capacity=hisparse_capacity(
            device_groups, source, num_blocks, host_pool.num_blocks, workload
        ),
        device_pool=DevicePool(
            layout=layout,
            bytes_per_block=bytes_per_block,
            size=device_size,
            available_bytes=device.available_bytes,
            num_blocks_override=device.num_blocks_override,
        ),
        workload=workload,
        warnings=notes,
    )


def _uniform_group(
    runs: list[LayerRun], buckets: list[SpecBucket], role: GroupRole
) -> PlacedGroup:
    specs = members(runs)
    group = KVCacheGroup.trusted({
        "layer_names": list(specs),
        "spec": uniform_spec(specs, buckets),
        "role": role,
        "host_resident": role == "hisparse_source",
        "enable_kv_transfer": True,
    })
    return PlacedGroup(group, buckets)


def _derived_specs(
    packs: list[HotPack], block_size: int, hot_blocks: int
) -> tuple[dict[int, HisparseResidentSpec], dict[int, HisparseHotSpec]]:
    """One resident and one hot spec per page size, shared by every pack of that size."""
    pages = {pack.page for pack in packs}
    resident = {
        page: HisparseResidentSpec(block_size=block_size, page_size_bytes=page) for page in pages
    }
    hot = {
        page: HisparseHotSpec(
            block_size=block_size, page_size_bytes=page, blocks_per_request=hot_blocks
        )
        for page in pages
    }
    return resident, hot


def _derived_group(
    pack: HotPack, suffix: str, spec: HisparseResidentSpec | HisparseHotSpec
) -> PlacedGroup:
    names = [name + suffix for name in pack.names]
    group = KVCacheGroup.trusted({
        "layer_names": names,
        "spec": spec,
        "role": "default",
        "host_resident": False,
        "enable_kv_transfer": False,
    })
    return PlacedGroup(group, [SpecBucket(spec, names)])
