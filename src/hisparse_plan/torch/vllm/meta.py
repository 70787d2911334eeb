"""Full-size vLLM plans without the memory: bind every view of a plan on meta-device pools.

A meta tensor has a size and no bytes, so a 60 GiB device pool and a 64 GiB host pool cost
nothing, yet torch still checks each view against its storage. That proves, for the real
sizes, that every view can be taken in its dtype, fits its pool, and has exactly the plan's
shape, strides and offset. A plan with pipeline stages is checked stage by stage, each stage's
layers on a pool of that stage's size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hisparse_plan.models import KVCachePlan
from hisparse_plan.torch.allocation import Arguments
from hisparse_plan.torch.vllm.binding import check_bound
from hisparse_plan.torch.vllm.pools import allocate_vllm
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


def meta_check_vllm(plan: KVCachePlan, stage: int | None = None) -> MetaReport:
    """`meta_check` for a vLLM plan (see `hisparse_plan.torch.meta_check`): every stage, or
    only `stage` when given, each on meta pools of its own size."""
    stages = (range(len(plan.device_pools)) if stage is None
              else [resolve_stage(plan, stage)])
    host_bytes = 0
    stage_bytes: list[int] = []
    views: dict[str, torch.Tensor] = {}
    for index in stages:
        with allocate_vllm(plan, Arguments(device="meta", pin=False, stage=index)) as pools:
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
