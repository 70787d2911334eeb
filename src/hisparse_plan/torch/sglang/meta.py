"""Full-size SGLang plans without the memory: every allocation on the meta device, SGLang's
tensors bound and checked against the plan's numbers, and every page range bound inside its
allocation. A meta tensor has a size and no bytes, yet torch checks each view against its
storage: that proves, for the real sizes, that every tensor fits its allocation."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hisparse_plan.models.sglang_plan import SGLangPlan
from hisparse_plan.torch.allocation import Arguments
from hisparse_plan.torch.sglang.binding import (
    BufferKey,
    allocations,
    bind_buffer,
    bind_pages,
    check_buffer,
    page_trains,
    placed_views,
)
from hisparse_plan.torch.sglang.pools import allocate_sglang


@dataclass(frozen=True, slots=True)
class SGLangMetaReport:
    """SGLang's tensors a full-size SGLang plan yields, on meta allocations."""

    host_bytes: int
    device_bytes: int
    """Bytes of every device allocation (a per-layer pool counts once per layer)."""
    allocations: int
    buffers: dict[BufferKey, torch.Tensor]
    pages: int
    """Page ranges bound: one per range of each layer."""


def meta_check_sglang(plan: SGLangPlan, stage: int | None = None) -> SGLangMetaReport:
    """`meta_check` for an SGLang plan (see `hisparse_plan.torch.meta_check`)."""
    with allocate_sglang(plan, Arguments(device="meta", pin=False, stage=stage)) as pools:
        held = pools.allocations()
        buffers: dict[BufferKey, torch.Tensor] = {}
        for placed in placed_views(plan):
            allocation = held.get(placed.allocation)
            if allocation is None:
                continue
            tensor = bind_buffer(placed, allocation)
            check_buffer(placed, tensor, allocation)
            buffers[placed.key] = tensor
        pages = 0
        for train in page_trains(plan):
            if train.allocation in held:
                bind_pages(train, held[train.allocation])
                pages += 1
        host = {pool.name for pool in plan.pools if pool.location == "host"}
        return SGLangMetaReport(
            host_bytes=sum(buffer.numel() for (name, _), buffer in held.items() if name in host),
            device_bytes=sum(buffer.numel() for (name, _), buffer in held.items()
                             if name not in host),
            allocations=len([key for key in allocations(plan, plan.pools) if key in held]),
            buffers=buffers, pages=pages,
        )
