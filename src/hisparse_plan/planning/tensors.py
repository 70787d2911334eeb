"""Placing each group's layers in its pool: strides and offsets (SPEC 5.9)."""

from __future__ import annotations

from hisparse_plan.errors import LayoutError
from hisparse_plan.models import (
    AttentionLayerSpec,
    Axis,
    KVCacheLayout,
    KVCacheTensor,
)
from hisparse_plan.planning.buckets import PlacedGroup
from hisparse_plan.planning.strides import axis_strides

BLOCK_OUTERMOST = " or ".join(layout.value for layout in KVCacheLayout if layout.block_outermost)


def group_tensors(
    placed: PlacedGroup,
    layout: KVCacheLayout,
    num_blocks: int,
    bytes_per_block: int,
    pool_size: int,
) -> list[KVCacheTensor]:
    tensors = []
    byte_offset = 0
    outermost = layout.block_outermost
    host_resident = placed.group.host_resident
    for spec, names in placed.buckets:
        page = spec.page_size_bytes
        if isinstance(spec, AttentionLayerSpec):
            layer_stride, block_stride = _layer_and_block_strides(
                spec, len(names), layout, num_blocks, bytes_per_block if outermost else None
            )
            offset = byte_offset * max(layer_stride, page) // page
            _check_alignment(spec, names[0], offset, layer_stride, block_stride)
        elif outermost:  # resident and hot pages are byte rows, one block apart
            layer_stride, block_stride, offset = page, bytes_per_block, byte_offset
        else:
            raise LayoutError(
                f"device.kv_cache_layout: HiSparse resident and hot groups need a "
                f"block-outermost layout ({BLOCK_OUTERMOST}), got {layout.value}",
                field="device.kv_cache_layout",
            )
        tensors.append(
            KVCacheTensor.trusted({
                "size": pool_size,
                "layers": list(names),
                "layer_stride": layer_stride,
                "block_stride": block_stride,
                "offset": offset,
                "host_resident": host_resident,
            })
        )
        byte_offset += len(names) * page
    return tensors


def _layer_and_block_strides(
    spec: AttentionLayerSpec,
    num_layers: int,
    layout: KVCacheLayout,
    num_blocks: int,
    fixed_block_stride: int | None,
) -> tuple[int, int]:
    """The L and B strides of [layers, blocks, H, N, C] in `layout` (B pinned when given)."""
    extents: dict[Axis, int] = {
        "L": num_layers,
        "B": num_blocks,
        "H": spec.num_kv_heads,
        "N": spec.block_size,
        "C": spec.content_bytes,
    }
    fixed: dict[Axis, int] | None = (
        None if fixed_block_stride is None else {"B": fixed_block_stride}
    )
    strides = axis_strides(layout, extents, fixed)
    return strides["L"], strides["B"]


def _check_alignment(
    spec: AttentionLayerSpec, name: str, offset: int, layer_stride: int, block_stride: int
) -> None:
    """A layer view is taken in the layer's dtype, so every byte step must be whole elements."""
    size = spec.dtype_size
    for what, value in (("offset", offset), ("layer stride", layer_stride),
                        ("block stride", block_stride)):
        if value % size:
            raise LayoutError(
                f"layers[{name!r}]: its {what} of {value} bytes is not a multiple of the "
                f"{spec.dtype} size {size}, so no {spec.dtype} view can address it; expected "
                f"pages whose sizes keep {spec.dtype} rows aligned",
                field=f"layers[{name!r}]",
            )
