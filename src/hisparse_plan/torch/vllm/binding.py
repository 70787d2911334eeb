"""Layer views bound to real (or meta) pool buffers.

All geometry comes from `hisparse_plan.views`: this module only turns a `LayerView` into a
tensor, after proving with the same integers that the tensor lies inside its pool and can be
taken in its dtype, so a bad plan is a `BackendError` naming the layer, never a torch error.
"""

from __future__ import annotations

import torch

from hisparse_plan.models import DType, KVCachePlan
from hisparse_plan.torch.errors import BackendError
from hisparse_plan.torch.vllm.stages import resolve_stage, stage_views
from hisparse_plan.views import LayerView

TORCH_DTYPES: dict[DType, torch.dtype] = {
    "uint8": torch.uint8,
    "int8": torch.int8,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float32": torch.float32,
}


def pool_name(view: LayerView) -> str:
    return "host" if view.host_resident else "device"


def describe(view: LayerView) -> str:
    return f"tensors[{view.tensor}] layer {view.name!r}"


def byte_extent(view: LayerView) -> int:
    """Bytes from block 0's first byte to the end of its page's last element."""
    return sum((extent - 1) * stride for extent, stride in
               zip(view.shape[1:], view.strides[1:], strict=True)) + view.itemsize


def check_fits(view: LayerView, pool_bytes: int) -> None:
    """Every page of the view inside [0, pool_bytes), every number whole elements."""
    found = view.misaligned()
    if found is not None:
        what, value = found
        raise BackendError(
            f"{describe(view)}: {what} {value} is not a multiple of the {view.dtype} size "
            f"{view.itemsize}, so the layer cannot be viewed as {view.dtype}"
        )
    page_end = view.offset + byte_extent(view)
    end = page_end + (view.num_blocks - 1) * view.block_stride
    if end <= pool_bytes:
        return
    # The first block whose page ends past the pool.
    block = 0 if page_end > pool_bytes or view.block_stride == 0 else (
        (pool_bytes - page_end) // view.block_stride + 1
    )
    block_end = page_end + block * view.block_stride
    raise BackendError(
        f"{describe(view)}: block {block}'s page ends at byte {block_end}, past the "
        f"{pool_name(view)} pool's {pool_bytes} bytes; expected all {view.num_blocks} blocks "
        f"inside the pool (offset {view.offset}, block stride {view.block_stride})"
    )


def bind_view(view: LayerView, pool: torch.Tensor) -> torch.Tensor:
    """The layer's [num_blocks, H, N, C] tensor (or [num_blocks, page] bytes) on `pool`."""
    check_fits(view, pool.numel())
    byte_shape = (*view.shape[:-1], view.shape[-1] * view.itemsize)
    byte_strides = (*view.strides[:-1], 1)
    raw = pool.as_strided(byte_shape, byte_strides, pool.storage_offset() + view.offset)
    dtype = TORCH_DTYPES[view.dtype]
    return raw if dtype == torch.uint8 else raw.view(dtype)


def bind_views(
    plan: KVCachePlan, host: torch.Tensor | None, device: torch.Tensor, stage: int | None = None
) -> dict[str, torch.Tensor]:
    """Every layer's tensor, by name, in plan order: the layers of pipeline stage `stage`
    (`device` is that stage's pool; None for a one-stage plan) and the host layers."""
    bound: dict[str, torch.Tensor] = {}
    for name, view in stage_views(plan, resolve_stage(plan, stage)).items():
        target = plan.kv_sharing.get(name)
        if target is not None:
            # As vLLM's bind_kv_caches: the sharing layer gets its target's very tensor.
            bound[name] = bound[target]
            continue
        pool = host if view.host_resident else device
        if pool is None:
            raise BackendError(
                f"{describe(view)} is host-resident, but there is no host pool buffer; "
                "expected a plan with a host_pool"
            )
        bound[name] = bind_view(view, pool)
    return bound


def check_bound(view: LayerView, tensor: torch.Tensor, pool: torch.Tensor) -> None:
    """The bound tensor addresses exactly what the plan says: shape, dtype, byte strides and
    byte offset, on the pool's own storage."""
    itemsize = tensor.element_size()
    got = {
        "dtype": tensor.dtype,
        "shape": tuple(tensor.shape),
        "byte strides": tuple(stride * itemsize for stride in tensor.stride()),
        "byte offset": (tensor.storage_offset() - pool.storage_offset()) * itemsize,
        "storage bytes": tensor.untyped_storage().nbytes(),
    }
    expected = {
        "dtype": TORCH_DTYPES[view.dtype],
        "shape": view.shape,
        "byte strides": view.strides,
        "byte offset": view.offset,
        "storage bytes": pool.untyped_storage().nbytes(),
    }
    for what, value in expected.items():
        if got[what] != value:
            raise BackendError(f"{describe(view)}: the bound view's {what} is {got[what]}; "
                               f"expected {value} from the plan")
    if tensor.device.type != "meta" and (
        tensor.untyped_storage().data_ptr() != pool.untyped_storage().data_ptr()
    ):
        raise BackendError(f"{describe(view)}: the bound view is not on the {pool_name(view)} "
                           "pool's storage")
