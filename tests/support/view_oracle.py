"""A brute-force judge of an SGLang plan's engine views, for the tests of check_plan: every byte
of every page and every element of every view listed with numpy, so it shares no arithmetic
with the checker's closed form. Only for tiny plans; this module holds no tests itself."""

from __future__ import annotations

import numpy as np

from hisparse_plan.models.plan import KVCacheTensor
from hisparse_plan.models.pools import BUFFER_DTYPE_SIZE, BufferView, Pool
from hisparse_plan.models.sglang_plan import SGLangPlan

NO_PAGE = -1


def _page_owners(pool: Pool, tensors: list[tuple[int, KVCacheTensor]]) -> tuple[
        np.ndarray, dict[tuple[int, int, int, int], int], list[str]]:
    """Which page owns each byte of one allocation: page ids by (tensor, layer, block, range),
    and the faults met while placing them (a page outside the allocation or on another)."""
    owner = np.full(pool.size, NO_PAGE, dtype=np.int64)
    ids: dict[tuple[int, int, int, int], int] = {}
    faults: list[str] = []
    layers_of = {index: (len(t.layers) if pool.allocation == "whole" else 1)
                 for index, t in tensors}
    for index, tensor in tensors:
        for layer in range(layers_of[index]):
            for block in range(pool.num_blocks):
                for number, part in enumerate(tensor.ranges or []):
                    start = (tensor.offset + layer * tensor.layer_stride
                             + block * tensor.block_stride + part.offset)
                    end = start + part.size
                    page = ids.setdefault((index, layer, block, number), len(ids))
                    if end > pool.size:
                        faults.append(f"page {index, layer, block, number} ends at {end}")
                        continue
                    if (owner[start:end] != NO_PAGE).any():
                        faults.append(f"page {index, layer, block, number} meets another")
                    owner[start:end] = page
    return owner, ids, faults


def _element_starts(view: BufferView) -> np.ndarray:
    """The first byte of every element, in the view's own index order."""
    starts = np.full(tuple(view.shape), view.storage_offset, dtype=np.int64)
    for axis, (extent, stride) in enumerate(zip(view.shape, view.strides, strict=True)):
        shape = [1] * len(view.shape)
        shape[axis] = extent
        starts = starts + (np.arange(extent, dtype=np.int64) * stride).reshape(shape)
    return starts * BUFFER_DTYPE_SIZE[view.dtype]


def _rows_a_page(view: BufferView, rows: int, pool: Pool) -> int:
    """SGLang's meaning of a view's rows: a token each when there are enough rows for every
    token of every block, else a page each."""
    tokens = pool.block_tokens or 1
    return tokens if rows >= pool.num_blocks * tokens else 1


def _allocation_faults(pool: Pool, tensors: list[tuple[int, KVCacheTensor]]) -> list[str]:
    owner, ids, faults = _page_owners(pool, tensors)
    if faults:
        return faults
    covered = np.zeros(pool.size, dtype=np.int64)
    layered = pool.allocation == "whole"
    for index, tensor in tensors:
        for number, view in enumerate(tensor.views):
            itemsize = BUFFER_DTYPE_SIZE[view.dtype]
            where = f"tensors[{index}] view {view.name}"
            if len(view.shape) != len(view.strides) or 0 in view.shape:
                faults.append(f"{where} is malformed or empty")
                continue
            starts = _element_starts(view)
            if not layered:
                starts = starts[None]  # one layer: this allocation's
            rows = starts.shape[1]
            flat = starts.reshape(starts.shape[0], rows, -1)
            if flat.min() < 0 or flat.max() + itemsize > pool.size:
                faults.append(f"{where} reaches outside the allocation")
                continue
            span = (flat[..., None] + np.arange(itemsize)).reshape(flat.shape[0], rows, -1)
            np.add.at(covered, span.ravel(), 1)
            per_page = _rows_a_page(view, rows, pool)
            owned = pool.num_blocks * per_page
            for layer in range(flat.shape[0]):
                for row in range(rows):
                    got = owner[span[layer, row]]
                    if row < owned:
                        page = ids.get((index, layer, row // per_page, number))
                        if page is None or (got != page).any():
                            faults.append(f"{where} layer {layer} row {row} leaves its page")
                    elif (got != NO_PAGE).any():
                        faults.append(f"{where} spare row {row} meets a page")
    if (covered > 1).any():
        byte = int(np.nonzero(covered > 1)[0][0])
        faults.append(f"byte {byte} is reached by two view elements")
    return faults


def view_faults(plan: SGLangPlan) -> list[str]:
    """Every way a view of `plan` reaches a byte it may not, judged byte by byte on one
    allocation of each pool (a per-layer pool's allocations hold the same pages): empty for
    sound views."""
    faults: list[str] = []
    for pool in plan.pools:
        layers = plan.allocation_layers(pool)
        tensors = [(index, tensor) for index, tensor in enumerate(plan.tensors)
                   if tensor.pool == pool.name
                   and (layers[0] is None or layers[0] in tensor.layers)]
        faults += [f"pool {pool.name}: {fault}" for fault in _allocation_faults(pool, tensors)]
    return faults
