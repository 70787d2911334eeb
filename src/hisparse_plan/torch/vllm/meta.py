"""Full-size plans without the memory: bind every view of a plan on meta-device pools.

A meta tensor has a size and no bytes, so a 60 GiB device pool and a 64 GiB host pool cost
nothing, yet torch still checks each view against its storage. That proves, for the real
sizes, that every view can be taken in its dtype, fits its pool, and has exactly the plan's
shape, strides and offset. A plan with pipeline stages is checked stage by stage, each stage's
layers on a pool of that stage's size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import overload

import torch

from hisparse_plan.models import KVCachePlan
from hisparse_plan.models.sglang_plan import SGLangPlan
from hisparse_plan.torch.sglang.pools import (
    BufferKey,
    allocations,
    bind_buffer,
    bind_pages,
    check_buffer,
    page_trains,
    placed_views,
)
from hisparse_plan.torch.vllm.binding import check_bound
from hisparse_plan.torch.vllm.pools import allocate
from hisparse_plan.torch.vllm.stages import resolve_stage, stage_views


@dataclass(frozen=True, slots=True)
class MetaReport:
    """The views a full-size plan yields: one meta tensor per layer, by name."""

    host_bytes: int
    device_bytes: int
    """The device pools' bytes, summed over the stages checked."""
    views: dict[str, torch.Tensor]
    stage_bytes: tuple[int, ...] = ()
    """Each checked stage's device pool bytes, in stage order (one entry for one stage)."""

    @property
    def layers(self) -> int:
        return len(self.views)


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


@overload
def meta_check(plan: KVCachePlan, stage: int | None = None) -> MetaReport: ...


@overload
def meta_check(plan: SGLangPlan, stage: int | None = None) -> SGLangMetaReport: ...


def meta_check(
    plan: KVCachePlan | SGLangPlan, stage: int | None = None
) -> MetaReport | SGLangMetaReport:
    """Bind every layer view of `plan` on meta pools of its full size and check each one
    against the plan's numbers; raise `BackendError` on the first that disagrees. A plan with
    pipeline stages: every stage, or only `stage` when given. An SGLang plan: every
    allocation on meta, SGLang's tensors bound and checked, every page range bound inside its
    allocation; nothing is touched (`SGLangMetaReport`)."""
    if isinstance(plan, SGLangPlan):
        return meta_check_sglang(plan, stage)
    stages = (range(len(plan.device_pools)) if stage is None
              else [resolve_stage(plan, stage)])
    host_bytes = 0
    stage_bytes: list[int] = []
    views: dict[str, torch.Tensor] = {}
    for index in stages:
        with allocate(plan, device="meta", pin=False, stage=index) as pools:
            bound = pools.views()
            host, device = pools.host, pools.device
            for name, view in stage_views(plan, index).items():
                pool = host if view.host_resident and host is not None else device
                check_bound(view, bound[name], pool)
            host_bytes = 0 if host is None else host.numel()
            stage_bytes.append(device.numel())
            views.update(bound)
    return MetaReport(host_bytes=host_bytes, device_bytes=sum(stage_bytes), views=views,
                      stage_bytes=tuple(stage_bytes))


def meta_check_sglang(plan: SGLangPlan, stage: int | None = None) -> SGLangMetaReport:
    """`meta_check` for an SGLang plan."""
    with allocate(plan, device="meta", pin=False, stage=stage) as pools:
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
