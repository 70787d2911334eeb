"""Where an SGLang plan's pages and buffers lie on its allocations, and binding them there.

A per-layer pool is one flat uint8 buffer per layer of its tensors (SGLang keeps a list of
tensors, one per layer); a whole pool is one flat buffer. Every buffer starts at storage offset
0, so a view's storage offset in the plan is its storage offset in torch. Each of SGLang's own
tensors is bound as the plan's `BufferView`s say (`bind_buffer`), and each range of a layer's
pages as [num_blocks, range bytes] bytes (`bind_pages`), for `verify`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from hisparse_plan.models.pools import BUFFER_DTYPE_SIZE, BufferDType, BufferView, Pool
from hisparse_plan.models.sglang_plan import SGLangPlan
from hisparse_plan.torch.errors import BackendError
from hisparse_plan.views import Train

AllocationKey = tuple[str, str | None]
"""(pool name, layer): the layer's own buffer of a per-layer pool, or None for a whole pool."""
BufferKey = tuple[str, str | None, str]
"""(pool name, layer or None, view name): one of SGLang's tensors, e.g. ("kv", "model.layers.0
.self_attn.attn", "k_buffer"); a whole pool's views span every layer and have None."""

BUFFER_TORCH_DTYPES: dict[BufferDType, torch.dtype] = {
    "uint8": torch.uint8, "int8": torch.int8, "float8_e4m3fn": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2, "bfloat16": torch.bfloat16, "float16": torch.float16,
    "int16": torch.int16, "float32": torch.float32, "int32": torch.int32,
    "float64": torch.float64, "int64": torch.int64,
}


@dataclass(frozen=True, slots=True)
class PageTrain:
    """One range of one layer's pages in one allocation: block `b`'s part is `size` bytes at
    byte `start + b * block_stride` of the allocation."""

    allocation: AllocationKey
    tensor: int
    layer: str
    range: int
    start: int
    size: int
    block_stride: int
    num_blocks: int
    host_resident: bool
    stage: int

    def where(self) -> str:
        return (f"tensors[{self.tensor}] layer {self.layer!r} range {self.range} in "
                f"{describe_allocation(self.allocation)}")


@dataclass(frozen=True, slots=True)
class PlacedView:
    """A `BufferView` of tensor `tensor` on allocation `allocation`."""

    key: BufferKey
    allocation: AllocationKey
    tensor: int
    view: BufferView


def describe_allocation(key: AllocationKey) -> str:
    pool, layer = key
    return f"pool {pool!r}" if layer is None else f"pool {pool!r} (layer {layer!r})"


def allocations(plan: SGLangPlan, pools: Sequence[Pool]) -> list[AllocationKey]:
    """The allocations of `pools`, in plan order: one per layer of a per-layer pool's tensors,
    one for a whole pool."""
    return [(pool.name, layer) for pool in pools for layer in plan.allocation_layers(pool)]


def page_trains(plan: SGLangPlan) -> list[PageTrain]:
    """Every range of every layer's pages, in plan order."""
    pools = {pool.name: pool for pool in plan.pools}
    trains = []
    for index, tensor in enumerate(plan.tensors):
        pool = pools[tensor.pool]
        for position, layer in enumerate(tensor.layers):
            key: AllocationKey = (pool.name, layer if pool.allocation == "per_layer" else None)
            for number, part in enumerate(tensor.ranges or []):
                trains.append(PageTrain(
                    key, index, layer, number,
                    tensor.offset + position * tensor.layer_stride + part.offset, part.size,
                    tensor.block_stride, pool.num_blocks, pool.location == "host", pool.stage,
                ))
    return trains


def host_trains(plan: SGLangPlan, pool: str) -> list[Train]:
    """Every range of every layer's pages in host pool `pool`, as trains over its blocks (a
    per-layer host pool's layers lie back to back in one mapping: `host_layer_offsets`)."""
    offsets = host_layer_offsets(plan, pool)
    return [Train(train.start + offsets[train.allocation[1]], train.size, train.block_stride,
                  train.num_blocks, train.tensor, train.layer, 0)
            for train in page_trains(plan)
            if train.allocation[0] == pool and train.allocation[1] in offsets]


def host_layer_offsets(plan: SGLangPlan, pool: str) -> dict[str | None, int]:
    """Where each allocation of host pool `pool` starts in its one mapping: a whole pool at 0,
    a per-layer pool's layers (DeepSeek-V4's paged host pool) one after another, in plan
    order."""
    found = next(p for p in plan.pools if p.name == pool)
    return {layer: index * found.size
            for index, layer in enumerate(plan.allocation_layers(found))}


def placed_views(plan: SGLangPlan) -> list[PlacedView]:
    """Every SGLang buffer on every allocation, in plan order: a per-layer pool's views once
    per layer, a whole pool's once."""
    pools = {pool.name: pool for pool in plan.pools}
    placed = []
    for index, tensor in enumerate(plan.tensors):
        pool = pools[tensor.pool]
        layers: list[str | None] = (
            list(tensor.layers) if pool.allocation == "per_layer" else [None])
        for layer in layers:
            for view in tensor.views:
                placed.append(PlacedView((pool.name, layer, view.name), (pool.name, layer),
                                         index, view))
    return placed


def bind_buffer(placed: PlacedView, allocation: torch.Tensor) -> torch.Tensor:
    """SGLang's tensor: the plan's dtype, shape, strides and storage offset (in elements) on
    the allocation's own storage, after proving it lies inside."""
    view = placed.view
    where = f"view {view.name!r} of tensors[{placed.tensor}] on " + describe_allocation(
        placed.allocation)
    if len(view.shape) != len(view.strides):
        raise BackendError(f"{where}: {len(view.shape)} dims but {len(view.strides)} strides; "
                           "expected one stride per dim")
    nbytes = allocation.numel()
    end = view.end_byte
    if end > nbytes:
        raise BackendError(f"{where} ends at byte {end}, past the allocation's {nbytes} bytes; "
                           "expected it inside")
    itemsize = BUFFER_DTYPE_SIZE[view.dtype]
    dtype = BUFFER_TORCH_DTYPES[view.dtype]
    # A typed view of the whole allocation, cut to whole elements: as_strided then counts the
    # storage offset in elements of the dtype, as SGLang's tensors do. Its storage offset is
    # absolute in the storage, so the allocation's own start is added (an allocation may be a
    # slice of a larger buffer, as page views and vLLM views allow too).
    typed = allocation[: nbytes // itemsize * itemsize].view(dtype)
    return typed.as_strided(view.shape, view.strides,
                            typed.storage_offset() + view.storage_offset)


def check_buffer(placed: PlacedView, tensor: torch.Tensor, allocation: torch.Tensor) -> None:
    """The bound tensor is exactly the plan's view: dtype, shape, strides, storage offset, and
    the allocation's own storage."""
    view = placed.view
    got = {
        "dtype": tensor.dtype, "shape": list(tensor.shape), "strides": list(tensor.stride()),
        # In bytes from the allocation's start: the two offsets count different element sizes.
        "start byte": tensor.storage_offset() * tensor.element_size()
        - allocation.storage_offset(),
        "storage bytes": tensor.untyped_storage().nbytes(),
    }
    expected = {
        "dtype": BUFFER_TORCH_DTYPES[view.dtype], "shape": list(view.shape),
        "strides": list(view.strides),
        "start byte": view.storage_offset * BUFFER_DTYPE_SIZE[view.dtype],
        "storage bytes": allocation.untyped_storage().nbytes(),
    }
    where = f"view {view.name!r} of tensors[{placed.tensor}] on " + describe_allocation(
        placed.allocation)
    for what, value in expected.items():
        if got[what] != value:
            raise BackendError(f"{where}: the bound tensor's {what} is {got[what]}; expected "
                               f"{value} from the plan")
    if tensor.device.type != "meta" and (
        tensor.untyped_storage().data_ptr() != allocation.untyped_storage().data_ptr()
    ):
        raise BackendError(f"{where}: the bound tensor is not on its allocation's storage")


def check_train_fits(train: PageTrain, nbytes: int) -> None:
    """Every block's part of the range inside the allocation."""
    end = train.start + (train.num_blocks - 1) * train.block_stride + train.size
    if end > nbytes:
        raise BackendError(
            f"{train.where()}: block {train.num_blocks - 1}'s part ends at byte {end}, past "
            f"the allocation's {nbytes} bytes; expected all {train.num_blocks} blocks inside "
            f"(start {train.start}, block stride {train.block_stride})"
        )


def bind_pages(train: PageTrain, allocation: torch.Tensor) -> torch.Tensor:
    """The range's parts of every block as [num_blocks, size] bytes of the allocation."""
    check_train_fits(train, allocation.numel())
    return allocation.as_strided((train.num_blocks, train.size), (train.block_stride, 1),
                                 allocation.storage_offset() + train.start)
