"""A vLLM plan's host pool: the mapping's size, every host view inside it, the runs a
registration chunk must not cut, and when it may be shared."""

from __future__ import annotations

import torch

from hisparse_plan.models import KVCachePlan
from hisparse_plan.rules.arith import round_up
from hisparse_plan.torch.errors import BackendError
from hisparse_plan.torch.hostmem.mapping import OS_PAGE
from hisparse_plan.torch.vllm.binding import check_fits
from hisparse_plan.views import Train, plan_views


def host_pool_bytes(plan: KVCachePlan) -> int:
    """The host pool mapping's size: max(host_pool.size, block_stride * num_blocks), and for a
    shared pool that rounded up to the OS page.

    The plan's host tensors stride by `bytes_per_block` (the source page) and span
    `host_pool.size`; `host_pool.block_stride` is that page rounded up to 4096 bytes when the
    pool is shared, so that a rank addressing blocks by the pool's own stride stays inside the
    mapping too. The larger of the two therefore serves both readings, and equals `size` for a
    private pool (where the two strides agree), so nothing changes there. A shared pool is a
    file every rank maps whole, hence whole OS pages, identical in every rank. Every host view
    must fit the result; one that does not is refused (`check_host_views`) rather than given a
    bigger pool, since a view past the planned pool means the plan is wrong.
    """
    pool = plan.host_pool
    if pool is None:
        raise BackendError("the plan has no host_pool; expected one to size")
    needed = max(pool.size, pool.block_stride * pool.num_blocks)
    return round_up(needed, OS_PAGE) if pool.shared else needed


def check_host_views(plan: KVCachePlan, nbytes: int) -> None:
    """Every host layer view inside a pool of `nbytes`, before any memory is touched."""
    for view in plan_views(plan).values():
        if view.host_resident:
            check_fits(view, nbytes)


def check_shared(plan: KVCachePlan, name: str | None, device: torch.device) -> None:
    """`host_pool_name` only for a plan whose host pool is shared, on real memory."""
    if name is None:
        return
    if plan.host_pool is None:
        raise BackendError(
            f"host_pool_name={name!r} was given, but the plan has no host_pool to share"
        )
    if not plan.host_pool.shared:
        raise BackendError(
            f"host_pool_name={name!r} asks for a shared host pool, but the plan's "
            "host_pool.shared is false; plan with hisparse.shared_host_pool = true (its "
            "blocks are then page-aligned for the shared mapping), or drop host_pool_name"
        )
    if device.type == "meta":
        raise BackendError(
            f"host_pool_name={name!r} with device='meta': meta pools hold no memory to share"
        )



def host_trains(plan: KVCachePlan) -> list[Train]:
    """Every run of every host layer, as trains over the host pool's blocks."""
    return [
        train
        for view in plan_views(plan).values()
        if view.host_resident
        for train in view.trains()
    ]
