"""The exceptions a caller can catch, siblings under one base.

`PlanError` (a `ValueError`) refuses a request or a plan; the torch backend's `BackendError`
refuses to allocate, bind or release memory. Neither is the other; `HisparsePlanError` catches
both.
"""

from __future__ import annotations


class HisparsePlanError(Exception):
    """Anything hisparse_plan refuses."""


class PlanError(HisparsePlanError, ValueError):
    """A request cannot be planned, or a plan does not hold together.

    `field` is the dotted request path the message is about (``"hisparse.host_pool_gib"``,
    ``"layers['model.layers.0.self_attn.attn']"``), or None when no single field is at fault.
    """

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class UnsupportedRequestError(PlanError):
    """A well-formed request that this version does not plan (yet)."""


class CapacityError(PlanError):
    """A pool is too small for what the request needs."""


class LayoutError(PlanError):
    """The cache layout cannot hold the groups, or a view would be misaligned."""


class PlanInvariantError(PlanError):
    """`check_plan` found a plan that breaks an invariant (see docs/planning-rules.md#invariants).

    `tensor` is the index into `plan.tensors`, `layer` the layer name and `block` the block id
    of the first violation, each None when the violation is not about one.
    """

    def __init__(
        self,
        message: str,
        *,
        tensor: int | None = None,
        layer: str | None = None,
        block: int | None = None,
    ) -> None:
        super().__init__(message)
        self.tensor = tensor
        self.layer = layer
        self.block = block


class PlanWarning(UserWarning):
    """A request that plans, but wastes memory (also listed in `KVCachePlan.warnings`)."""
