"""Capacity along one axis, context length or host pool size: HiSparse against its baseline,
or a regular model's own capacity (context length only: it has no host pool)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final, Literal

from hisparse_plan.errors import PlanError, UnsupportedRequestError
from hisparse_plan.models import PlanRequest
from hisparse_plan.models.base import GIB, Model, PositiveInt
from hisparse_plan.operator.baseline import RegularCapacity, regular_capacity
from hisparse_plan.operator.compare import CapacityComparison, compare
from hisparse_plan.presets import Settings, context_length, override_request

SweepAxis = Literal["max-model-len", "host-pool"]
SWEEP_AXES: Final[tuple[SweepAxis, ...]] = ("max-model-len", "host-pool")

SHORTEST_CONTEXT: Final = 4096
HOST_POOL_POINTS: Final = tuple(2**k * GIB for k in range(4, 11))
"""16 GiB to 1 TiB, doubling: a node's DRAM choices."""


class SweepPoint(Model):
    value: PositiveInt
    """Tokens (max-model-len) or bytes (host-pool)."""
    comparison: CapacityComparison | None
    """HiSparse against its baseline at this point; None for a regular model or a refusal."""
    error: str | None
    """Why the planner refused this point (e.g. a host pool too small for one request)."""
    regular: RegularCapacity | None = None
    """A regular model's capacity at this point; None for HiSparse or a refusal."""


class Sweep(Model):
    axis: SweepAxis
    points: list[SweepPoint]


def default_points(axis: SweepAxis, request: PlanRequest, longest: int | None = None) -> list[int]:
    """Doubling context lengths from 4096 up to `longest` (default: the request's), which is
    always the last point; or doubling host pools from 16 GiB to 1 TiB."""
    if axis == "host-pool":
        return list(HOST_POOL_POINTS)
    top = longest or request.model.max_model_len
    points = []
    length = SHORTEST_CONTEXT
    while length < top:
        points.append(length)
        length *= 2
    return [*points, top]


def sweep(
    request: PlanRequest,
    axis: SweepAxis,
    values: Iterable[int],
    *,
    max_position_embeddings: int | None = None,
    allow_long_context: bool = False,
) -> Sweep:
    """Compare at each value of `axis`, the rest of `request` unchanged.

    A regular request (no HiSparse) gets its own capacity at each point; along host-pool it
    is refused before any point, having no host pool. With the model's
    `max_position_embeddings`, a max-model-len point past it is refused unless
    `allow_long_context` (as a preset's max_model_len is)."""
    values = list(values)
    if request.hisparse is None and axis == "host-pool":
        raise UnsupportedRequestError(
            "sweep host-pool: a regular model keeps its whole cache on the GPU and has no host "
            "pool to size; expected --sweep max-model-len (or a request with hisparse settings)",
            field="hisparse",
        )
    if axis == "max-model-len" and max_position_embeddings is not None:
        for value in values:
            context_length(
                max_position_embeddings,
                Settings(max_model_len=value, allow_long_context=allow_long_context or None),
            )
    points = []
    for value in values:
        settings = (
            Settings(max_model_len=value)
            if axis == "max-model-len"
            else Settings(host_pool_bytes=value)
        )
        try:
            points.append(_point(override_request(request, settings), value))
        except PlanError as error:
            reason = " ".join(str(error).split())
            points.append(SweepPoint(value=value, comparison=None, error=reason))
    return Sweep(axis=axis, points=points)


def _point(request: PlanRequest, value: int) -> SweepPoint:
    """One point: HiSparse against its baseline, or a regular model's capacity."""
    if request.hisparse is not None:
        return SweepPoint(value=value, comparison=compare(request), error=None)
    found = regular_capacity(request)
    if found.refusal is not None:
        return SweepPoint(value=value, comparison=None, error=found.refusal)
    return SweepPoint(value=value, comparison=None, error=None, regular=found)
