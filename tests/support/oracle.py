"""A brute-force referee for small plans: enumerate every byte every page touches.

Independent of the checker's train arithmetic: it walks each layer view element by element
(numpy), so tests can compare `check_plan`'s verdict with the literal truth.
"""

from __future__ import annotations

import numpy as np

from hisparse_plan.models import KVCachePlan
from hisparse_plan.views import LayerView, plan_views


def touched_bytes(view: LayerView) -> np.ndarray:
    """Byte addresses of every element of every block, shape (blocks, bytes per page)."""
    grids = np.meshgrid(*[np.arange(extent, dtype=np.int64) for extent in view.shape],
                        indexing="ij")
    address = np.full(grids[0].shape, view.offset, dtype=np.int64)
    for grid, stride in zip(grids, view.strides, strict=True):
        address += grid * stride
    per_element = address.reshape(view.shape[0], -1)
    within = np.arange(view.itemsize, dtype=np.int64)
    return (per_element[:, :, None] + within).reshape(view.shape[0], -1)


def total_bytes(plan: KVCachePlan) -> int:
    return sum(view.num_blocks * view.page_size_bytes for view in plan_views(plan).values())


def violations(plan: KVCachePlan) -> list[str]:
    """What is wrong with the plan's geometry, found by enumeration (empty when sound)."""
    found: list[str] = []
    views = plan_views(plan)
    Entry = tuple[np.ndarray, np.ndarray, int, str]
    pools: dict[tuple[bool, int], tuple[int, list[Entry]]] = {
        (False, stage): (pool.size, []) for stage, pool in enumerate(plan.device_pools)
    }
    pools[True, 0] = (plan.host_pool.size if plan.host_pool else 0, [])
    for view in views.values():
        if view.offset % view.itemsize or any(s % view.itemsize for s in view.strides[:3]):
            found.append(f"{view.name}: misaligned for {view.dtype}")
        addresses = touched_bytes(view)
        blocks = np.broadcast_to(np.arange(view.num_blocks)[:, None], addresses.shape)
        pools[view.pool][1].append(
            (addresses.ravel(), blocks.ravel(), view.group, view.name)
        )
    for (host, stage), (size, entries) in pools.items():
        if not entries:
            continue
        address = np.concatenate([e[0] for e in entries])
        block = np.concatenate([e[1] for e in entries])
        group = np.concatenate([np.full(e[0].shape, e[2]) for e in entries])
        owner = np.concatenate([np.full(e[0].shape, i) for i, e in enumerate(entries)])
        if address.size and (address.min() < 0 or address.max() >= size):
            found.append(f"{'host' if host else f'device {stage}'} pool: a page leaves [0, {size})")
        order = np.lexsort((owner, group, address))
        address, block, group = address[order], block[order], group[order]
        same_byte = address[1:] == address[:-1]
        clash = same_byte & ((group[1:] == group[:-1]) | (block[1:] != block[:-1]))
        if clash.any():
            where = int(np.flatnonzero(clash)[0])
            found.append(f"{'host' if host else f'device {stage}'} pool: byte {address[where]} is "
                         "shared by pages that may not share it")
    return found
