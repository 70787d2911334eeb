"""Full-size plans without the memory: bind every view of a plan on meta-device pools.

A meta tensor has a size and no bytes, so a 60 GiB device pool and a 64 GiB host pool cost
nothing, yet torch still checks each view against its storage. That proves, for the real
sizes, that every view can be taken in its dtype, fits its pool, and has exactly the plan's
shape, strides and offset.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hisparse_plan.models import KVCachePlan
from hisparse_plan.torch.binding import check_bound
from hisparse_plan.torch.pools import allocate
from hisparse_plan.views import plan_views


@dataclass(frozen=True, slots=True)
class MetaReport:
    """The views a full-size plan yields: one meta tensor per layer, by name."""

    host_bytes: int
    device_bytes: int
    views: dict[str, torch.Tensor]

    @property
    def layers(self) -> int:
        return len(self.views)


def meta_check(plan: KVCachePlan) -> MetaReport:
    """Bind every layer view of `plan` on meta pools of its full size and check each one
    against the plan's numbers; raise `BackendError` on the first that disagrees."""
    with allocate(plan, device="meta", pin=False) as pools:
        bound = pools.views()
        host, device = pools.host, pools.device
        for name, view in plan_views(plan).items():
            pool = host if view.host_resident and host is not None else device
            check_bound(view, bound[name], pool)
        return MetaReport(
            host_bytes=0 if host is None else host.numel(),
            device_bytes=device.numel(),
            views=bound,
        )
