"""The plan contract (see docs/plan-contract.md), with the pool and workload facts it was sized
from."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from hisparse_plan.errors import PlanError
from hisparse_plan.models.base import (
    READ_ONLY,
    ByteCount,
    LayerName,
    Model,
    PositiveInt,
    empty_frozen_list,
    freeze,
    is_empty,
)
from hisparse_plan.models.engines import VLLM
from hisparse_plan.models.fingerprint import fingerprint as layout_fingerprint
from hisparse_plan.models.group_specs import GroupSpec
from hisparse_plan.models.layout import KVCacheLayout
from hisparse_plan.models.pools import Pool
from hisparse_plan.models.tensors import (
    Capacity,
    Concurrency,
    KVCacheTensor,
    LayerNames,
    refuse_layer_floods,
)
from hisparse_plan.models.version_1 import upgrade_version_1

__all__ = [
    "Capacity",
    "Concurrency",
    "DevicePool",
    "GroupRole",
    "HostPool",
    "KVCacheGroup",
    "KVCachePlan",
    "KVCacheTensor",
    "LayerNames",
    "Workload",
]
"""KVCacheTensor, Capacity and their types live in tensors.py (SGLang's plan is made of them
too) and are still read from here."""

GroupRole = Literal["default", "hisparse_source", "hisparse_indexer"]


class KVCacheGroup(Model):
    """Layers that share one block table: a block id given to a request holds one page of
    every layer of the group (see docs/plan-contract.md#kvcachegroup)."""

    layer_names: LayerNames = Field(
        description="The group's layers, in order; HiSparse's derived layers end in "
        "'.hisparse_resident' or '.hisparse_hot'."
    )
    spec: GroupSpec = Field(description="What one block of the group holds (kind, block_size, "
                            "page_size_bytes, and the kind's own fields).")
    role: GroupRole = Field(
        description="hisparse_source (the host-resident latent rows), hisparse_indexer, or "
        "default."
    )
    host_resident: bool = Field(description="True only for the source group: its blocks are "
                                "in the host pool.")
    enable_kv_transfer: bool = Field(
        description="Whether a KV connector may move the group's blocks (false for resident "
        "and hot groups, which hold copies)."
    )


class HostPool(Model):
    """The pinned host pool holding the source group (see docs/planning-rules.md#host-pool)."""

    num_blocks: PositiveInt = Field(description="Host blocks: budget_bytes // block_stride.")
    block_stride: PositiveInt = Field(
        description="Source page, rounded up to 4096 bytes when the pool is shared."
    )
    shared: bool = Field(description="Tensor-parallel ranks on one node map this one pool.")
    bytes_per_block: PositiveInt = Field(description="What the host tensors stride per block.")
    size: ByteCount = Field(description="bytes_per_block * num_blocks: what the tensors span.")
    budget_bytes: ByteCount = Field(description="int(host_pool_gib * 2**30).")
    layout: Annotated[KVCacheLayout, Field(strict=False)] = Field(
        default=KVCacheLayout.LBNHC, description="The host tensors' layout."
    )


class DevicePool(Model):
    """A GPU pool (one per pipeline stage) that every non-source group overlays from byte 0."""

    layout: Annotated[KVCacheLayout, Field(strict=False)] = Field(
        description="Physical order of the axes L, B, H, N, C, outermost first."
    )
    bytes_per_block: PositiveInt = Field(
        description="One block of every device group, aligned (see "
        "docs/planning-rules.md#device-pool)."
    )
    size: ByteCount = Field(description="bytes_per_block * num_blocks.")
    available_bytes: ByteCount = Field(
        description="GPU memory the stage was given for its KV cache."
    )
    num_blocks_override: PositiveInt | None = Field(description="The override asked for, if any.")
    layers: Annotated[list[LayerName], READ_ONLY] | None = Field(
        default=None,
        description="The pipeline stage's layers; null when one stage holds every layer.",
    )


class Workload(Model):
    """The request's figures that sizing, admission and capacity used, so that a plan can be
    re-derived without its request."""

    max_model_len: PositiveInt = Field(description="As requested (before any auto-fit).")
    max_num_batched_tokens: PositiveInt = Field(description="The scheduler's tokens per step.")
    max_concurrent_batches: PositiveInt = Field(
        description="Batches in flight; times max_num_batched_tokens: the tokens in flight."
    )
    num_prefill_lookahead_tokens: Annotated[int, Field(ge=0)] = Field(
        default=0, description="Tokens a speculative drafter reads past the scheduled range."
    )
    index_topk: PositiveInt | None = Field(
        default=None, description="HiSparse: the model's index_topk, as requested."
    )
    top_k: PositiveInt | None = Field(
        default=None, description="HiSparse: the top-k rows the hot buffer is sized for."
    )
    device_buffer_size: PositiveInt | None = Field(
        default=None, description="HiSparse: hot rows per request, as planned."
    )
    max_decode_query_len: PositiveInt | None = Field(
        default=None, description="HiSparse: rows of one decode query (1 + speculative tokens)."
    )
    mamba_cache_mode: Literal["none", "align"] = Field(
        default="none",
        description="Mamba states per request: one (none), or block-aligned checkpoints for "
        "prefix caching (align).",
    )
    decode_context_parallel_size: Annotated[int, Field(ge=1)] = Field(
        default=1, description="DCP ranks that shard a layer's token positions at decode."
    )

    @property
    def max_in_flight_tokens(self) -> int:
        return self.max_num_batched_tokens * self.max_concurrent_batches

    @property
    def extra_window_tokens(self) -> int:
        """Tokens sliding-window layers keep below their window for a drafter (see
        docs/planning-rules.md#pages)."""
        return max(0, self.num_prefill_lookahead_tokens - 1)


class KVCachePlan(Model):
    """Where every byte of the KV cache lives: the groups that share block tables, the tensors
    that place each layer's pages in a pool, the pools, and what they hold. Every field is
    described in docs/plan-contract.md; the rules that decide them in docs/planning-rules.md.
    A plan is frozen, and dumps to JSON that validates back to an equal plan."""

    schema_version: Literal[2] = Field(
        default=2,
        description="2 (pools and page ranges); a version 1 plan is read as version 2.",
    )
    engine: Literal["vllm"] = Field(
        default=VLLM, description="The engine whose pools the plan lays out."
    )
    pools: Annotated[list[Pool], Field(min_length=1), READ_ONLY] = Field(
        description="Every pool: the host pool first (HiSparse), then each stage's device pool."
    )
    num_blocks: PositiveInt = Field(
        description="Blocks of every device pool (the fewest any pipeline stage holds, or the "
        "override)."
    )
    groups: Annotated[list[KVCacheGroup], Field(min_length=1), READ_ONLY] = Field(
        description="The cache groups, in order: layers that share one block table."
    )
    tensors: Annotated[list[KVCacheTensor], Field(min_length=1), READ_ONLY] = Field(
        description="Every layer's pages: the host tensors first, then each stage's device "
        "tensors."
    )
    host_pool: HostPool | None = Field(
        description="The pinned host pool of the HiSparse source layers; null for a regular "
        "plan."
    )
    capacity: Capacity = Field(description="How many max_model_len requests the pools hold.")
    fitted_max_model_len: PositiveInt | None = Field(
        default=None, description="The length the plan was sized for when auto-fit was asked."
    )
    device_pools: Annotated[list[DevicePool], Field(min_length=1), READ_ONLY] = Field(
        description="One pool per pipeline stage, in stage order."
    )
    workload: Workload = Field(
        description="The request's figures that sizes, admission and capacity came from."
    )
    warnings: Annotated[list[str], READ_ONLY] = Field(
        default_factory=empty_frozen_list,
        description="Conditions that plan but waste memory (also raised as PlanWarning).",
    )
    kv_sharing: dict[LayerName, LayerName] = Field(
        default_factory=dict, exclude_if=is_empty,
        description="Cross-layer KV sharing: layer -> the layer whose pages it reads. A "
        "sharing layer is in no group and no tensor; its view is its target's (see "
        "docs/plan-contract.md#cross-layer-kv-sharing). Left out of the JSON when empty.",
    )

    def model_post_init(self, context: object, /) -> None:
        freeze(self, "kv_sharing", self.kv_sharing)

    @model_validator(mode="before")
    @classmethod
    def _read_version_1(cls, data: object) -> object:
        return refuse_layer_floods(upgrade_version_1(data))

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
        return layout_fingerprint(self)

    @property
    def max_model_len(self) -> int:
        """The length every figure of the plan is sized for."""
        fitted = self.fitted_max_model_len
        return self.workload.max_model_len if fitted is None else fitted
