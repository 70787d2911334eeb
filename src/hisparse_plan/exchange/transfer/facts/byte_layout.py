"""A tensor's (and field's) logical bytes as check_transfer reads them: one `ByteLayout` per
run of bytes that an engine's plan places by strides, whichever engine's plan it is."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

Origin = Callable[[str], int]
"""A layer's first global head on this rank."""
StatePieces = Callable[[str, int, tuple[int, ...], int], tuple[list[tuple[int, int, int]], int]]
"""(layer, state index, its per-rank shape, its bytes) -> the rank's pieces of the state
(byte in the rank's state, byte in the full state, bytes) and the full state's bytes."""


def whole_states(layer: str, index: int, shape: tuple[int, ...], size: int
                 ) -> tuple[list[tuple[int, int, int]], int]:
    """A state moved rank to rank: one piece, the rank's own state."""
    return [(0, 0, size)], size


@dataclass(frozen=True, slots=True)
class Axis:
    kind: str
    """layer, block, head or unit."""
    stride: int
    extent: int


@dataclass(frozen=True, slots=True)
class ByteLayout:
    """Logical byte `lo + c` of (layers[l], block b, local head h, unit n of the block) is at
    `base + l * S_layer + b * S_block + h * S_head + n * S_unit + c` of `region`, c < size."""

    region: str
    base: int
    size: int
    lo: int
    layers: tuple[str, ...]
    head_origin: int
    units: int
    table: str
    axes: tuple[Axis, ...]
    state: bool = False
    """A Mamba state: the request's last block of its table holds it."""

    def axis(self, kind: str) -> Axis | None:
        return next((axis for axis in self.axes if axis.kind == kind), None)


def addressing(*axes: Axis) -> tuple[Axis, ...]:
    """Axes that address something, widest stride first (a block axis always stays)."""
    kept = [axis for axis in axes if axis.extent > 1 or axis.kind == "block"]
    return tuple(sorted(kept, key=lambda axis: -axis.stride))
