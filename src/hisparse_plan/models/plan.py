"""The plan contract (SPEC section 6), with the pool and workload facts it was sized from."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from hisparse_plan.models.base import ByteCount, LayerName, Model, PositiveInt
from hisparse_plan.models.group_specs import GroupSpec
from hisparse_plan.models.layout import KVCacheLayout

GroupRole = Literal["default", "hisparse_source", "hisparse_indexer"]
LayerNames = Annotated[list[LayerName], Field(min_length=1)]
Concurrency = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class KVCacheGroup(Model):
    """Layers that share one block table."""

    layer_names: LayerNames
    spec: GroupSpec
    role: GroupRole
    host_resident: bool
    enable_kv_transfer: bool


class KVCacheTensor(Model):
    """Same-spec layers in one pool: layer `layers[l]`'s page of block `b` starts at
    `offset + l * layer_stride + b * block_stride` bytes into the pool."""

    size: ByteCount
    layers: LayerNames
    layer_stride: ByteCount
    block_stride: ByteCount
    offset: ByteCount
    host_resident: bool


class HostPool(Model):
    """The pinned host pool holding the source group."""

    num_blocks: PositiveInt
    block_stride: PositiveInt = Field(
        description="Source page, rounded up to 4096 bytes when the pool is shared."
    )
    shared: bool
    bytes_per_block: PositiveInt = Field(description="What the host tensors stride per block.")
    size: ByteCount = Field(description="bytes_per_block * num_blocks: what the tensors span.")
    budget_bytes: ByteCount = Field(description="int(host_pool_gib * 2**30).")
    layout: Annotated[KVCacheLayout, Field(strict=False)] = KVCacheLayout.LBNHC


class DevicePool(Model):
    """The GPU pool every non-source group overlays from byte 0."""

    layout: Annotated[KVCacheLayout, Field(strict=False)]
    bytes_per_block: PositiveInt
    size: ByteCount = Field(description="bytes_per_block * num_blocks.")
    available_bytes: ByteCount
    num_blocks_override: PositiveInt | None


class Workload(Model):
    """The request sizes the capacity figures assume."""

    max_model_len: PositiveInt
    max_num_batched_tokens: PositiveInt
    max_concurrent_batches: PositiveInt

    @property
    def max_in_flight_tokens(self) -> int:
        return self.max_num_batched_tokens * self.max_concurrent_batches


class Capacity(Model):
    """How many max_model_len requests the pools hold (SPEC 5.10)."""

    max_concurrency: Concurrency
    steady_state_concurrency: Concurrency | None


class KVCachePlan(Model):
    schema_version: Literal[1] = 1
    num_blocks: PositiveInt
    groups: Annotated[list[KVCacheGroup], Field(min_length=1)]
    tensors: Annotated[list[KVCacheTensor], Field(min_length=1)]
    host_pool: HostPool | None
    capacity: Capacity
    device_pool: DevicePool
    workload: Workload
    warnings: list[str] = Field(default_factory=list)
