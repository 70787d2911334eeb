"""The physical order of a cache tensor's logical axes [L, B, H, N, C]."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal, cast

Axis = Literal["L", "B", "H", "N", "C"]


class KVCacheLayout(StrEnum):
    """A layout names the axes outermost first: L layers, B blocks, H heads, N tokens, C bytes.

    Members are strings, so the traits below read the letters directly (no `.value` lookup:
    the planner asks them on its hot path).
    """

    LBNHC = "LBNHC"
    LBHNC = "LBHNC"
    LHBNC = "LHBNC"
    BLHNC = "BLHNC"
    BLNHC = "BLNHC"
    BHLNC = "BHLNC"

    @property
    def axes(self) -> tuple[Axis, ...]:
        """Physical axes, outermost first."""
        return cast(tuple[Axis, ...], tuple(self))

    @property
    def block_outermost(self) -> bool:
        """Every block is one contiguous slab of the pool."""
        return self[0] == "B"

    @property
    def block_compact(self) -> bool:
        """Layers and blocks are the two outermost axes, so one block of one layer is contiguous."""
        return self[:2] in ("LB", "BL")

    @property
    def layer_compact(self) -> bool:
        """Every layer is one contiguous slab of the pool."""
        return self[0] == "L"
