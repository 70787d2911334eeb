"""The plan contract (SPEC section 6), with the pool and workload facts it was sized from."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from hisparse_plan.errors import PlanError
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
    """A GPU pool (one per pipeline stage) that every non-source group overlays from byte 0."""

    layout: Annotated[KVCacheLayout, Field(strict=False)]
    bytes_per_block: PositiveInt
    size: ByteCount = Field(description="bytes_per_block * num_blocks.")
    available_bytes: ByteCount
    num_blocks_override: PositiveInt | None
    layers: list[LayerName] | None = Field(
        default=None,
        description="The pipeline stage's layers; null when one stage holds every layer.",
    )


class Workload(Model):
    """The request's figures that sizing, admission and capacity used, so that a plan can be
    re-derived without its request."""

    max_model_len: PositiveInt = Field(description="As requested (before any auto-fit).")
    max_num_batched_tokens: PositiveInt
    max_concurrent_batches: PositiveInt
    num_prefill_lookahead_tokens: Annotated[int, Field(ge=0)] = 0
    index_topk: PositiveInt | None = Field(
        default=None, description="HiSparse: the model's index_topk, as requested."
    )
    top_k: PositiveInt | None = Field(
        default=None, description="HiSparse: the top-k rows the hot buffer is sized for."
    )
    device_buffer_size: PositiveInt | None = Field(
        default=None, description="HiSparse: hot rows per request, as planned."
    )
    max_decode_query_len: PositiveInt | None = None
    mamba_cache_mode: Literal["none", "align"] = "none"
    decode_context_parallel_size: Annotated[int, Field(ge=1)] = 1

    @property
    def max_in_flight_tokens(self) -> int:
        return self.max_num_batched_tokens * self.max_concurrent_batches

    @property
    def extra_window_tokens(self) -> int:
        """Tokens sliding-window layers keep below their window for a drafter (SPEC 7.1)."""
        return max(0, self.num_prefill_lookahead_tokens - 1)


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
    fitted_max_model_len: PositiveInt | None = Field(
        default=None, description="The length the plan was sized for when auto-fit was asked."
    )
    device_pools: Annotated[list[DevicePool], Field(min_length=1)] = Field(
        description="One pool per pipeline stage, in stage order."
    )
    workload: Workload
    warnings: list[str] = Field(default_factory=list)

    @property
    def device_pool(self) -> DevicePool:
        """The device pool of a plan with one pipeline stage."""
        if len(self.device_pools) != 1:
            raise PlanError(
                f"the plan has {len(self.device_pools)} pipeline stages, each with its own "
                "device pool; expected one: pick one of device_pools",
                field="device_pools",
            )
        return self.device_pools[0]

    @property
    def fingerprint(self) -> str:
        """A stable hash of everything that decides where a byte lives (groups, tensors,
        pools; not capacity figures or metadata): two plans with one fingerprint lay out KV
        alike (`hisparse_plan.exchange`)."""
        from hisparse_plan.exchange.fingerprint import fingerprint  # exchange reads models

        return fingerprint(self)

    @property
    def max_model_len(self) -> int:
        """The length every figure of the plan is sized for."""
        fitted = self.fitted_max_model_len
        return self.workload.max_model_len if fitted is None else fitted
