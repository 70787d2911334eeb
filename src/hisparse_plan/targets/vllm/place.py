"""Tensors: each group's layers placed in its pool, with strides and offsets (SPEC 5.9, 7.5).

Pure arithmetic on decisions already made; the only refusals are layouts that cannot hold a
page (derived byte rows outside a block-outermost layout, a padded page split by an outer axis,
a view misaligned for its dtype, a Mamba state misaligned for its own).
"""

from __future__ import annotations

from hisparse_plan.errors import LayoutError
from hisparse_plan.models import (
    DerivedLayerSpec,
    DType,
    HisparseHotSpec,
    HisparseResidentSpec,
    KVCacheLayout,
    KVCacheTensor,
    MambaSpec,
    dtype_size,
)
from hisparse_plan.rules.strides import layer_and_block_strides
from hisparse_plan.targets.vllm.rules.buckets import SpecBucket
from hisparse_plan.targets.vllm.rules.states import misaligned_state

BLOCK_OUTERMOST = " or ".join(layout.value for layout in KVCacheLayout if layout.block_outermost)


def place_pool(
    groups: list[list[SpecBucket]],
    layout: KVCacheLayout,
    num_blocks: int,
    bytes_per_block: int,
    *,
    pool: str,
    host_resident: bool = False,
) -> list[KVCacheTensor]:
    """The tensors of every group of pool `pool`; groups overlay each other from byte 0."""
    size = bytes_per_block * num_blocks
    tensors = []
    for buckets in groups:
        byte_offset = 0
        for spec, names in buckets:
            page = spec.page_size_bytes
            if isinstance(spec, HisparseResidentSpec | HisparseHotSpec):
                layer_stride, block_stride = _derived_strides(spec, layout, bytes_per_block)
            else:
                layer_stride, block_stride = layer_and_block_strides(
                    spec, names[0], len(names), num_blocks, layout, bytes_per_block
                )
                _check_alignment(spec.view_dtype, names[0], byte_offset, layer_stride, block_stride)
                if isinstance(spec, MambaSpec):
                    _check_states(spec, names, byte_offset, layer_stride, block_stride)
            tensors.append(KVCacheTensor(
                size=size,
                layers=names,
                layer_stride=layer_stride,
                block_stride=block_stride,
                offset=byte_offset,
                host_resident=host_resident,
                pool=pool,
            ))
            byte_offset += len(names) * (page if layout.block_outermost else layer_stride)
    if not layout.block_outermost and len(groups) > 1:
        _check_one_block_stride(tensors)
    return tensors


def _check_one_block_stride(tensors: list[KVCacheTensor]) -> None:
    """Groups overlay each other from byte 0, so they must stride blocks alike.

    Outside a block-outermost layout each group strides its own blocks; two strides would put
    block b of one group on another block id of another group. vLLM 0.33 places such requests
    (block_stride_alignment padding some pages and not others) and lets them corrupt each
    other, so they are refused here.
    """
    first = tensors[0]
    for tensor in tensors:
        if tensor.block_stride != first.block_stride:
            raise LayoutError(
                f"layers[{tensor.layers[0]!r}]: strides its blocks by {tensor.block_stride} "
                f"bytes while {first.layers[0]!r} strides them by {first.block_stride}; groups "
                "overlay one pool from byte 0, so expected one block stride for all (pad every "
                "page alike, or use a block-outermost layout)",
                field=f"layers[{tensor.layers[0]!r}].block_stride_alignment",
            )


def check_placeable(
    groups: list[list[SpecBucket]], layout: KVCacheLayout, bytes_per_block: int
) -> None:
    """The placement refusals, made before admission as if for one block (SPEC 7.5)."""
    place_pool(groups, layout, 1, bytes_per_block, pool="device")


def _derived_strides(
    spec: DerivedLayerSpec, layout: KVCacheLayout, bytes_per_block: int
) -> tuple[int, int]:
    """Resident and hot pages are byte rows, one block apart."""
    if not layout.block_outermost:
        raise LayoutError(
            f"device.kv_cache_layout: HiSparse resident and hot groups need a block-outermost "
            f"layout ({BLOCK_OUTERMOST}), got {layout.value}",
            field="device.kv_cache_layout",
        )
    return spec.page_size_bytes, bytes_per_block


def _check_alignment(
    dtype: DType, name: str, offset: int, layer_stride: int, block_stride: int
) -> None:
    """A layer view is taken in the layer's dtype, so every byte step must be whole elements."""
    size = dtype_size(dtype)
    for what, value in (("offset", offset), ("layer stride", layer_stride),
                        ("block stride", block_stride)):
        if value % size:
            raise LayoutError(
                f"layers[{name!r}]: its {what} of {value} bytes is not a multiple of the "
                f"{dtype} size {size}, so no {dtype} view can address it; expected pages whose "
                f"sizes keep {dtype} rows aligned",
                field=f"layers[{name!r}]",
            )


def _check_states(
    spec: MambaSpec, names: list[str], offset: int, layer_stride: int, block_stride: int
) -> None:
    """vLLM views each Mamba state in its own dtype, so each must start on whole elements of
    it, in every layer and block (targets/vllm/rules/states.py); vLLM pads nothing for it."""
    for position, name in enumerate(names):
        base = offset + position * layer_stride
        state = misaligned_state(spec, base, block_stride)
        if state is not None:
            raise LayoutError(
                f"layers[{name!r}].state_dtypes[{state.index}]: state {state.index} "
                f"({state.dtype} {list(state.shape)}) starts at byte {base + state.start} of "
                f"the pool, {state.start} into a page, with blocks {block_stride} bytes apart; "
                f"vLLM views it as {state.dtype}, which needs both to be multiples of "
                f"{state.itemsize} (it fails binding the layer); expected pages that keep every "
                "state on whole elements (state sizes in multiples of the widest dtype, or a "
                "state_alignment of it; see docs/planning-rules.md#placement)",
                field=f"layers[{name!r}].state_dtypes[{state.index}]",
            )
