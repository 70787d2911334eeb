"""A transfer manifest: what a KV-transfer engine (NIXL, Mooncake, LMCache) needs to register a
plan's memory and move pages between instances, as JSON.

Every pool is a memory region (size, alignment, blocks); every layer says where block `b`'s page
sits: `offset + b * block_stride` bytes into its region, with the per-block view's shape and byte
strides taken from `hisparse_plan.views` (the same numbers the checker and the torch backend
use) and the page as contiguous runs.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

from pydantic import Field

from hisparse_plan.exchange.movable import group_transferred, unmovable_kind
from hisparse_plan.models import (
    DType,
    GroupSpec,
    KVCacheLayout,
    KVCachePlan,
    dtype_size,
)
from hisparse_plan.models.base import ByteCount, Model, PositiveInt, is_empty, is_none
from hisparse_plan.models.fingerprint import fingerprint
from hisparse_plan.views import LayerView, plan_views, pool_name, spec_of

MANIFEST_VERSION: Final = 1
SHARED_HOST_ALIGNMENT: Final = 4096
"""A shared host pool is mapped by every TP rank page by page: its blocks are 4096-aligned."""
RegionName = Annotated[str, Field(min_length=1)]
""""host", "device", or "stage k device" when pipeline stages have pools of their own."""
Counts = Annotated[list[PositiveInt], Field(min_length=1)]
Strides = Annotated[list[ByteCount], Field(min_length=1)]


class MemoryRegion(Model):
    """One pool, to register with a transfer engine as one region."""

    name: RegionName
    location: Literal["host", "device"]
    stage: int = Field(ge=0, description="The pipeline stage of a device pool (0 for host).")
    size: ByteCount
    alignment: PositiveInt = Field(
        description="What the region's base address must be a multiple of: 4096 for a shared "
        "host pool, else the largest dtype size of its layers (every view stays aligned)."
    )
    num_blocks: PositiveInt
    bytes_per_block: PositiveInt = Field(
        description="What the pages of one block take, all layers together: size = "
        "bytes_per_block * num_blocks."
    )
    block_stride: PositiveInt = Field(
        description="The pool's block stride (see docs/planning-rules.md#host-pool): "
        "bytes_per_block, except a shared host "
        "pool's, rounded up to 4096 for the shared mapping."
    )
    layout: Annotated[KVCacheLayout, Field(strict=False)]
    shared: bool = Field(description="Mapped by every TP rank of the node (host pool only).")


class LayerEntry(Model):
    """Where one layer's pages sit: block `b`'s page starts at `offset + b * block_stride`
    bytes into `region`; inside it, element `i` of `block_shape` is at byte
    `sum(i_k * block_strides[k])` from the page's start."""

    name: str
    region: RegionName
    group: int = Field(ge=0, description="Index into the plan's groups (one block table).")
    tensor: int = Field(ge=0, description="Index into the plan's tensors.")
    derived: bool = Field(
        description="A resident or hot layer, which HiSparse fills on the GPU from the source "
        "cache: nothing to transfer."
    )
    refused: str | None = Field(
        default=None, exclude_if=is_none,
        description="Why a transfer refuses this layer (a kind this version does not move, "
        "exchange/movable.py, as `transfer` decides); left out when it moves.",
    )
    tokens_per_block: PositiveInt
    offset: ByteCount
    block_offset: ByteCount = Field(
        description="offset % block_stride: where the page sits inside its block. With blocks "
        "outermost (BL..., BH...) the byte of the block's slab; 0 with layers outermost, "
        "where the layer's slab start depends on num_blocks."
    )
    layer_stride: ByteCount
    block_stride: ByteCount
    num_blocks: PositiveInt
    page_bytes: PositiveInt
    dtype: DType
    block_shape: Counts = Field(
        description="(heads, tokens, elements) for attention layers; (page bytes,) for resident "
        "and hot layers."
    )
    block_strides: Strides = Field(description="Byte strides, one per axis of block_shape.")
    run_bytes: PositiveInt = Field(description="Bytes of each contiguous run of the page.")
    run_starts: Strides = Field(
        description="Byte offset of each run from the page's start: one run when the page is "
        "contiguous, one per head where heads lie apart (BHLNC, LHBNC)."
    )


class TransferManifest(Model):
    manifest_version: Literal[1] = MANIFEST_VERSION
    fingerprint: str = Field(pattern=r"^[0-9a-f]{64}$")
    regions: Annotated[list[MemoryRegion], Field(min_length=1)]
    layers: Annotated[list[LayerEntry], Field(min_length=1)]
    kv_sharing: dict[str, str] = Field(
        default_factory=dict, exclude_if=is_empty,
        description="Layer -> the layer whose pages it reads (cross-layer KV sharing): it has "
        "no entry in `layers` and nothing of its own to move; left out when empty.",
    )


def _layer(plan: KVCachePlan, view: LayerView, spec: GroupSpec) -> LayerEntry:
    run_bytes, run_starts = view.runs()
    moved = group_transferred(plan.groups[view.group])
    return LayerEntry(
        name=view.name,
        region=pool_name(plan, view.stage, view.host_resident),
        group=view.group,
        tensor=view.tensor,
        derived=not moved,
        refused=unmovable_kind(spec) if moved else None,
        tokens_per_block=plan.groups[view.group].spec.block_size,
        offset=view.offset,
        block_offset=view.offset % view.block_stride if view.block_stride else view.offset,
        layer_stride=plan.tensors[view.tensor].layer_stride,
        block_stride=view.block_stride,
        num_blocks=view.num_blocks,
        page_bytes=view.page_size_bytes,
        dtype=view.dtype,
        block_shape=list(view.shape[1:]),
        block_strides=list(view.strides[1:]),
        run_bytes=run_bytes,
        run_starts=run_starts,
    )


def _alignment(layers: list[LayerEntry], region: str, shared: bool) -> int:
    if shared:
        return SHARED_HOST_ALIGNMENT
    return max((dtype_size(entry.dtype) for entry in layers if entry.region == region),
               default=1)


def manifest(plan: KVCachePlan) -> TransferManifest:
    """The plan's transfer manifest: its pools as regions, every placed layer's geometry, and
    the layers that read another's pages."""
    specs = spec_of(plan)
    layers = [_layer(plan, view, specs[view.name][1])
              for view in plan_views(plan, specs).values()]
    regions: list[MemoryRegion] = []
    host = plan.host_pool
    if host is not None:
        regions.append(MemoryRegion(
            name="host", location="host", stage=0, size=host.size,
            alignment=_alignment(layers, "host", host.shared), num_blocks=host.num_blocks,
            bytes_per_block=host.bytes_per_block, block_stride=host.block_stride,
            layout=host.layout, shared=host.shared,
        ))
    for stage, device in enumerate(plan.device_pools):
        name = pool_name(plan, stage)
        regions.append(MemoryRegion(
            name=name, location="device", stage=stage, size=device.size,
            alignment=_alignment(layers, name, False), num_blocks=plan.num_blocks,
            bytes_per_block=device.bytes_per_block, block_stride=device.bytes_per_block,
            layout=device.layout, shared=False,
        ))
    return TransferManifest(fingerprint=fingerprint(plan), regions=regions, layers=layers,
                            kv_sharing=dict(plan.kv_sharing))
