"""What one request takes from each pool, and the concurrency each pool allows (see
docs/planning-rules.md#capacity).

The plan reports only the smaller of the two pools' bounds; operators also need to know which
one binds and by how much, so the terms are rebuilt here from the plan's groups with the
planner's own `required_blocks`.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

from hisparse_plan.errors import UnsupportedRequestError
from hisparse_plan.models import KVCachePlan
from hisparse_plan.operator.engines import required_blocks, steady_blocks

Binding = Literal["host", "device", "both"]
"""Which pool caps concurrency: "both" when their bounds are exactly equal."""
Metric = Literal["max", "steady"]
"""`max`: max_concurrency (every request holds its whole resident window); `steady`:
steady_state_concurrency (requests already reading from host hold only their tail pages)."""


@dataclass(frozen=True, slots=True)
class GroupDemand:
    """Blocks one max_model_len request takes from one device group."""

    group: int
    """Index into `plan.groups`."""
    blocks: int
    """At admission: `required_blocks` of the group's spec."""
    steady_blocks: int
    """Once reading from host: `steady_blocks` (resident groups keep only their tail)."""


@dataclass(frozen=True, slots=True)
class PoolBounds:
    host_blocks: int
    host_block_stride: int
    host_required: int
    """Host blocks one request takes: the source group's `required_blocks`."""
    num_blocks: int
    bytes_per_block: int
    demands: tuple[GroupDemand, ...]

    @property
    def admission(self) -> int:
        """Device blocks one request takes while it is admitted."""
        return sum(demand.blocks for demand in self.demands)

    @property
    def steady(self) -> int:
        """Device blocks one request keeps once it reads from host."""
        return sum(demand.steady_blocks for demand in self.demands)

    @property
    def host_bytes(self) -> int:
        """Host memory one request takes."""
        return self.host_required * self.host_block_stride

    @property
    def admission_bytes(self) -> int:
        """GPU memory one request takes while admitted."""
        return self.admission * self.bytes_per_block

    @property
    def steady_bytes(self) -> int:
        """GPU memory one request keeps once it reads from host."""
        return self.steady * self.bytes_per_block

    @property
    def host_bound(self) -> Fraction:
        return Fraction(self.host_blocks, self.host_required)

    def device_bound(self, metric: Metric) -> Fraction:
        if metric == "max" or self.num_blocks < self.admission:
            return Fraction(self.num_blocks, self.admission)
        return 1 + Fraction(self.num_blocks - self.admission, self.steady)

    def binding(self, metric: Metric) -> Binding:
        host, device = self.host_bound, self.device_bound(metric)
        return "both" if host == device else "host" if host < device else "device"

    def device_blocks_for(self, target: Fraction, metric: Metric) -> int:
        """The fewest device blocks whose bound reaches `target` (the inverse of device_bound)."""
        at_admission = -(-target * self.admission // 1)
        if metric == "max" or target <= 1:
            return int(at_admission)
        return self.admission + int(-(-(target - 1) * self.steady // 1))


def pool_bounds(plan: KVCachePlan) -> PoolBounds:
    """The capacity terms of a HiSparse plan."""
    if plan.host_pool is None:
        raise UnsupportedRequestError(
            "pool bounds are defined for HiSparse plans only; expected a plan with a host pool",
            field="hisparse",
        )
    source = next(group for group in plan.groups if group.role == "hisparse_source")
    demands = []
    for index, group in enumerate(plan.groups):
        if group.role == "hisparse_source":
            continue
        blocks = required_blocks(group.spec, plan.max_model_len, plan.workload)
        demands.append(GroupDemand(index, blocks, steady_blocks(group.spec, blocks)))
    return PoolBounds(
        host_blocks=plan.host_pool.num_blocks,
        host_block_stride=plan.host_pool.block_stride,
        host_required=required_blocks(source.spec, plan.max_model_len, plan.workload),
        num_blocks=plan.num_blocks,
        bytes_per_block=plan.device_pool.bytes_per_block,
        demands=tuple(demands),
    )


def metric_value(plan: KVCachePlan, metric: Metric) -> float:
    """The plan's own figure for `metric`."""
    capacity = plan.capacity
    if metric == "steady" and capacity.steady_state_concurrency is not None:
        return capacity.steady_state_concurrency
    return capacity.max_concurrency
