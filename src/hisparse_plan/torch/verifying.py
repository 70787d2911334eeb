"""What every engine's `verify` shares: the report it gives, and its refusal of meta pools."""

from __future__ import annotations

import math
from dataclasses import dataclass

from hisparse_plan.torch.errors import BackendError


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """What `verify` checked: `pages` layer pages of `bytes` bytes in all, each written and read
    back in every pass, in `seconds`."""

    groups: int
    layers: int
    pages: int
    bytes: int
    seconds: float
    sampled: bool
    """False when every block of every layer was checked."""

    @property
    def gb_per_s(self) -> float:
        """Page bytes verified per second, in 10**9 bytes."""
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else math.inf



def meta_pools_refused() -> BackendError:
    """The error for pools on the meta device, which hold no bytes to write and read back."""
    return BackendError(
        "verify needs real buffers, and meta pools hold no bytes; use meta_check(plan) to "
        "check the views of a full-size plan"
    )
