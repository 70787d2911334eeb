"""What the torch backend raises: every refusal is a `BackendError`, a sibling of `PlanError`
under `HisparsePlanError` (which catches both). An unsound plan is refused with
`UnsoundPlanError`, which is both: a `BackendError` and the `PlanInvariantError` that
`check_plan` raised."""

from __future__ import annotations

from hisparse_plan.errors import HisparsePlanError, PlanInvariantError


class BackendError(HisparsePlanError):
    """Pools cannot be allocated, bound or released as the plan asks."""


class UnsoundPlanError(BackendError, PlanInvariantError):
    """`allocate` was given a plan `check_plan` refuses (two pages sharing a byte, a view
    outside its pool, a number that does not follow from the others): no memory is touched.
    `tensor`, `layer` and `block` are those of `check_plan`'s error."""


class HostMemoryError(BackendError):
    """The host pool would take more RAM than the machine (or its cgroup) can give."""

    def __init__(self, message: str, *, requested: int, available: int) -> None:
        super().__init__(message)
        self.requested = requested
        self.available = available


class RegistrationError(BackendError):
    """Registering (pinning) the host pool with CUDA failed; nothing stays registered."""

    def __init__(self, message: str, *, chunk: int | None = None, code: int | None = None) -> None:
        super().__init__(message)
        self.chunk = chunk
        self.code = code


class VerifyError(BackendError):
    """A byte a layer view addresses is not the byte the plan's arithmetic names.

    `tensor` indexes `plan.tensors`, `layer` names the layer, `block` is the block id and
    `byte_offset` the byte of the pool (host pool for host-resident layers) that disagreed.
    """

    def __init__(
        self,
        message: str,
        *,
        tensor: int,
        layer: str,
        block: int,
        byte_offset: int,
    ) -> None:
        super().__init__(message)
        self.tensor = tensor
        self.layer = layer
        self.block = block
        self.byte_offset = byte_offset
