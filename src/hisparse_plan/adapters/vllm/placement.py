"""Placing vLLM's cache groups for a given block count with hisparse_plan's own stages.

vLLM asks a builder to materialize groups for exactly `num_blocks` blocks (for the probe of one
block, for profiling, and for every worker), with no admission check: so this runs the size and
place stages of the planner (SPEC 5.7-5.9, 7.4-7.5) on the groups as given, not `plan()`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import TypeAdapter

from hisparse_plan.adapters.vllm.layers import layer_dicts
from hisparse_plan.adapters.vllm.types import VllmObject
from hisparse_plan.models import (
    GroupSpec,
    HisparseConfig,
    HisparseHotSpec,
    HisparseResidentSpec,
    HostPool,
    KVCacheLayout,
    KVCacheTensor,
    LayerSpec,
    UniformTypeSpec,
)
from hisparse_plan.models.base import GIB
from hisparse_plan.models.pools import stage_pool_name
from hisparse_plan.targets.trace import Trace
from hisparse_plan.targets.vllm.host_pool import plan_host_pool
from hisparse_plan.targets.vllm.place import place_pool
from hisparse_plan.targets.vllm.rules.block_bytes import bytes_per_block, check_layout
from hisparse_plan.targets.vllm.rules.buckets import SpecBucket, stage_buckets

_LAYER_SPEC: TypeAdapter[LayerSpec] = TypeAdapter(LayerSpec)


@dataclass(frozen=True, slots=True)
class HostSettings:
    """What sizes the host pool: vLLM's budget, its shared-pool choice, the request length."""

    budget_bytes: int
    shared: bool
    max_model_len: int


@dataclass(frozen=True, slots=True)
class Placement:
    tensors: list[KVCacheTensor]
    host_pool: HostPool | None
    layers: dict[str, LayerSpec]
    """The placed groups' layers by name (HiSparse's derived resident and hot layers left
    out): what the kernels' stride rules read."""


def our_group_spec(group: VllmObject, extra_tokens: int) -> GroupSpec:
    """The contract's spec of one vLLM group (its own spec, or its members')."""
    spec = group.kv_cache_spec
    kind = type(spec).__name__
    if kind == "HiSparseResidentSpec":
        return HisparseResidentSpec(block_size=spec.block_size, page_size_bytes=spec.page_size)
    if kind == "HiSparseHotSpec":
        return HisparseHotSpec(block_size=spec.block_size, page_size_bytes=spec.page_size,
                               blocks_per_request=spec.blocks_per_request)
    if kind == "UniformTypeKVCacheSpecs":
        members = layer_dicts(spec.kv_cache_specs, extra_tokens)
        return UniformTypeSpec(
            block_size=spec.block_size,
            specs={name: _LAYER_SPEC.validate_python(member) for name, member in members.items()},
        )
    label = group.layer_names[0] if group.layer_names else "group"
    return _LAYER_SPEC.validate_python(layer_dicts({label: spec}, extra_tokens)[label])


def layer_specs(spec: GroupSpec, names: Sequence[str]) -> dict[str, LayerSpec]:
    """A group's layers by name: a uniform_type group's members, else `names` with its spec."""
    if isinstance(spec, UniformTypeSpec):
        return dict(spec.specs)
    if isinstance(spec, HisparseResidentSpec | HisparseHotSpec):
        return {}
    return dict.fromkeys(names, spec)


def place_groups(
    groups: Sequence[VllmObject],
    layout: KVCacheLayout,
    num_blocks: int,
    extra_tokens: int,
    host: HostSettings | None,
) -> Placement:
    """Tensors (host first, as vLLM lists them) and the host pool of `groups` at `num_blocks`."""
    device: list[list[SpecBucket]] = []
    source: list[SpecBucket] | None = None
    layers: dict[str, LayerSpec] = {}
    for group in groups:
        # The group's own layer names decide what this worker places, as in vLLM 0.34: a
        # pipeline stage holding none of a group's layers keeps the group and places nothing
        # for it (vLLM 0.33 placed the other stages' members of a uniform_type group here).
        names = list(group.layer_names)
        spec = our_group_spec(group, extra_tokens)
        layers.update(layer_specs(spec, names))
        buckets = stage_buckets(spec, names, set(names))
        if group.host_resident:
            source = buckets
        else:
            device.append(buckets)
    host_pool = None
    host_tensors: list[KVCacheTensor] = []
    if host is not None and source is not None:
        source_page = sum(bucket.block_bytes for bucket in source)
        host_pool = plan_host_pool(
            source_page,
            HisparseConfig(host_pool_gib=host.budget_bytes / GIB, shared_host_pool=host.shared),
            host.max_model_len,
            source[0].spec.block_size,
            Trace(),
        )
        host_tensors = place_pool([source], KVCacheLayout.LBNHC, host_pool.num_blocks,
                                  host_pool.bytes_per_block, host_resident=True,
                                  pool=stage_pool_name("host", 0, 1))
    check_layout(device, layout, "the device groups")
    per_block = bytes_per_block(device, layout)
    return Placement(
        host_tensors + place_pool(device, layout, num_blocks, per_block,
                                  pool=stage_pool_name("device", 0, 1)),
        host_pool,
        layers,
    )
