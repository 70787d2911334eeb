"""Sizing the host pool: the least DRAM that reaches a target, or the best a node can do.

Both searches run over whole host blocks (the host pool's block_stride), the pool's real unit:
a budget between two multiples of the stride buys no more blocks than the lower one. The
planner itself is the oracle at every step, so an answer is a host pool the planner was seen
to accept and reach the target with, while one block less (and so one byte less) was seen to
miss it. Concurrency never falls as the host pool grows, which is what makes bisection sound.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction
from typing import Annotated, Final, Literal

from pydantic import Field

from hisparse_plan.errors import CapacityError, PlanError, UnsupportedRequestError
from hisparse_plan.models import Capacity, KVCachePlan, PlanRequest
from hisparse_plan.models.base import GIB, INT64_MAX, ByteCount, Model, PositiveInt
from hisparse_plan.operator.bounds import Binding, Metric, metric_value, pool_bounds
from hisparse_plan.operator.engines import make_plan
from hisparse_plan.presets import Settings, host_pool_gib, override_request

PROBE_HOST_BYTES: Final = 2**50
"""A host pool (1 PiB) large enough that only the GPU can bind: it shows the GPU's bound."""
HOST_FIELD: Final = "hisparse.host_pool_gib"


class HostPoolTune(Model):
    """The smallest host pool whose plan reaches `target` concurrency."""

    mode: Literal["host-pool"] = "host-pool"
    metric: Metric
    target: float
    max_model_len: PositiveInt
    host_pool_bytes: PositiveInt
    """A whole number of host blocks: host_blocks * step_bytes."""
    host_pool_gib: float
    """host_pool_bytes / 2**30, exactly: int(host_pool_gib * 2**30) == host_pool_bytes."""
    host_blocks: PositiveInt
    step_bytes: PositiveInt
    """One host block (the pool's block_stride): the search's step."""
    capacity: Capacity
    """The plan's capacity at the answer."""
    binding: Binding
    below: float | None
    """The metric one step below the answer (short of the target); None when the planner
    refuses a pool that small."""


class BestTune(Model):
    """The best concurrency on the given GPU memory and DRAM, and the least host pool for it."""

    mode: Literal["best"] = "best"
    metric: Metric
    dram_bytes: PositiveInt
    max_model_len: PositiveInt
    capacity: Capacity
    """The plan's capacity with all of dram_bytes as the host pool."""
    binding: Binding
    host_pool_bytes: PositiveInt
    """The smallest host pool with the same metric (less than dram_bytes when the GPU binds)."""
    host_pool_gib: float
    host_blocks: PositiveInt
    step_bytes: PositiveInt
    spare_dram_bytes: ByteCount
    """dram_bytes - host_pool_bytes: DRAM that would buy no more concurrency."""


TuneResult = Annotated[HostPoolTune | BestTune, Field(discriminator="mode")]


def smallest_host_pool(
    request: PlanRequest, target: float, metric: Metric = "max"
) -> HostPoolTune:
    """The least host pool (in whole host blocks) whose plan reaches `target` concurrency.

    Raises `CapacityError` when the GPU binds below `target` whatever the host pool, saying how
    much GPU memory the target takes.
    """
    if not math.isfinite(target) or target <= 0:
        raise PlanError(f"target: expected a concurrency above 0, got {target}", field="target")
    _needs_hisparse(request)
    probe = _plan(request, PROBE_HOST_BYTES)
    if probe is None:
        raise CapacityError(
            f"{HOST_FIELD}: not even a {PROBE_HOST_BYTES} byte host pool holds one request",
            field=HOST_FIELD,
        )
    bounds = pool_bounds(probe)
    if bounds.device_bound(metric) < Fraction(target) or metric_value(probe, metric) < target:
        raise _gpu_binds(probe, target, metric)
    stride = bounds.host_block_stride

    def reaches(blocks: int) -> bool:
        found = _plan(request, blocks * stride)
        return found is not None and metric_value(found, metric) >= target

    enough = max(math.ceil(Fraction(target) * bounds.host_required), bounds.host_required)
    while not reaches(enough):  # the exact estimate can only be short by float rounding
        enough *= 2
    blocks = _least(reaches, enough)
    answer = _plan(request, blocks * stride)
    if answer is None or answer.host_pool is None:  # reaches() planned it a moment ago
        raise PlanError(f"{HOST_FIELD}: the planner refused the pool it accepted before")
    below = _plan(request, (blocks - 1) * stride) if blocks > 1 else None
    return HostPoolTune(
        metric=metric,
        target=target,
        max_model_len=answer.workload.max_model_len,
        host_pool_bytes=blocks * stride,
        host_pool_gib=host_pool_gib(blocks * stride),
        host_blocks=answer.host_pool.num_blocks,
        step_bytes=stride,
        capacity=answer.capacity,
        binding=pool_bounds(answer).binding(metric),
        below=None if below is None else metric_value(below, metric),
    )


def best_concurrency(request: PlanRequest, dram_bytes: int, metric: Metric = "max") -> BestTune:
    """Plan with all of `dram_bytes` as the host pool, then find the least pool that does as
    well: when the GPU binds, the rest of the DRAM buys nothing."""
    _needs_hisparse(request)
    full = make_plan(override_request(request, Settings(host_pool_bytes=dram_bytes)))
    if full.host_pool is None:
        raise PlanError("tuning a host pool needs a HiSparse request", field="hisparse")
    best = metric_value(full, metric)
    stride = full.host_pool.block_stride

    def reaches(blocks: int) -> bool:
        found = _plan(request, blocks * stride)
        return found is not None and metric_value(found, metric) >= best

    blocks = _least(reaches, full.host_pool.num_blocks)
    return BestTune(
        metric=metric,
        dram_bytes=dram_bytes,
        max_model_len=full.workload.max_model_len,
        capacity=full.capacity,
        binding=pool_bounds(full).binding(metric),
        host_pool_bytes=blocks * stride,
        host_pool_gib=host_pool_gib(blocks * stride),
        host_blocks=blocks,
        step_bytes=stride,
        spare_dram_bytes=dram_bytes - blocks * stride,
    )


def _needs_hisparse(request: PlanRequest) -> None:
    if request.hisparse is None:
        raise UnsupportedRequestError(
            "tune sizes HiSparse's host pool; expected a request with hisparse settings, got a "
            "regular one (it has no host pool to size)",
            field="hisparse",
        )


def _least(reaches: Callable[[int], bool], high: int) -> int:
    """The least n in [1, high] with reaches(n), given reaches(high) and monotonic reaches."""
    low = 0  # no pool of 0 blocks plans
    while high - low > 1:
        middle = (low + high) // 2
        if reaches(middle):
            high = middle
        else:
            low = middle
    return high


def _plan(request: PlanRequest, host_bytes: int) -> KVCachePlan | None:
    """The plan with this host pool, or None when the pool is too small for one request."""
    try:
        return make_plan(override_request(request, Settings(host_pool_bytes=host_bytes)))
    except CapacityError as error:
        if error.field == HOST_FIELD:
            return None
        raise


def _gpu_binds(probe: KVCachePlan, target: float, metric: Metric) -> CapacityError:
    bounds = pool_bounds(probe)
    reach = float(bounds.device_bound(metric))
    blocks = bounds.device_blocks_for(Fraction(target), metric)
    device = probe.device_pool
    needed = blocks * bounds.bytes_per_block
    if needed > INT64_MAX:
        fix = (f"no GPU can: it takes more than 2**63-1 bytes of KV cache in blocks of "
               f"{bounds.bytes_per_block} bytes")
    elif device.num_blocks_override is not None:
        fix = (f"set num_blocks_override to at least {blocks} ({blocks} blocks of "
               f"{bounds.bytes_per_block} bytes)")
    else:
        fix = (f"raise the GPU memory to at least {needed} bytes ({_gib(needed)}) ({blocks} "
               f"blocks of {bounds.bytes_per_block} bytes)")
    if device.num_blocks_override is not None:
        how = f"num_blocks_override {device.num_blocks_override} blocks"
    else:
        how = (
            f"{device.available_bytes} bytes ({_gib(device.available_bytes)}) of GPU memory "
            f"({probe.num_blocks} blocks)"
        )
    return CapacityError(
        f"the GPU binds: {how} hold at most {reach:.4f} concurrent "
        f"{probe.workload.max_model_len}-token requests ({metric}), short of the target "
        f"{target} whatever the host pool; {fix}",
        field="device.available_bytes",
    )


def _gib(nbytes: int) -> str:
    return f"{nbytes / GIB:.2f} GiB"
