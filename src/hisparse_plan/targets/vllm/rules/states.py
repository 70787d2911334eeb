"""Where a Mamba layer's states lie in its page, and whether vLLM can view each in its dtype
(docs/planning-rules.md#placement).

vLLM 0.34 (`MambaBase.bind_kv_cache`) takes a Mamba layer's pages as one byte row a block and
cuts each state out of it in order, every state's bytes rounded up to `state_alignment`, then
views the cut in the state's dtype. A byte tensor viewed in a wider dtype needs its first byte
and every stride to be whole elements: each state's first byte of block 0 and the block stride
must be multiples of the state's dtype size. vLLM pads nothing for this (its block stride is
the page rounded up to `state_alignment`, 1 unless FlashInfer's ReplaySSM asks 16), so a page
that misplaces a state fails when vLLM binds the layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from hisparse_plan.models import DType, MambaSpec, dtype_size
from hisparse_plan.rules.arith import round_up


@dataclass(frozen=True, slots=True)
class StateStart:
    """One state of a Mamba page: its index, its first byte in the page, its dtype."""

    index: int
    start: int
    dtype: DType
    shape: tuple[int, ...]

    @property
    def itemsize(self) -> int:
        return dtype_size(self.dtype)


def state_starts(spec: MambaSpec) -> list[StateStart]:
    """Every state of the page in vLLM's order, each at the bytes of those before it, rounded
    up to `state_alignment`."""
    starts = []
    byte = 0
    for index, (shape, dtype) in enumerate(zip(spec.state_shapes, spec.state_dtypes, strict=True)):
        starts.append(StateStart(index, byte, dtype, tuple(shape)))
        byte += round_up(prod(shape) * dtype_size(dtype), spec.state_alignment)
    return starts


def misaligned_state(spec: MambaSpec, base: int, block_stride: int) -> StateStart | None:
    """The first state whose first byte (`base` is the page's first byte of block 0) or block
    stride is not whole elements of its dtype; None when vLLM can view every state."""
    for state in state_starts(spec):
        if (base + state.start) % state.itemsize or block_stride % state.itemsize:
            return state
    return None
