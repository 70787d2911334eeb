"""check_transfer's own reading of where each logical byte lives: one `ByteLayout` per tensor
(and field), derived from the plans' public descriptions with arithmetic of its own, by each
engine's reading (`engines.py`): a vLLM plan's transfer manifest, an SGLang plan's buffer views.
The lowering reads places another way (vLLM's layer views, SGLang's page ranges), so a slip in
either shows as a refused program."""

from __future__ import annotations

from hisparse_plan.exchange.transfer.facts.byte_layout import (
    Axis,
    ByteLayout,
    Origin,
    StatePieces,
    whole_states,
)
from hisparse_plan.exchange.transfer.facts.engines import reading
from hisparse_plan.models.any_plan import Plan

__all__ = ["Axis", "ByteLayout", "Origin", "StatePieces", "patterns", "region_sizes"]


def patterns(plan: Plan, wanted: set[str], origin: Origin,
             pieces: StatePieces = whole_states) -> dict[str, list[ByteLayout]]:
    """Every pattern of the layers in `wanted`, by region (a state's per piece of the full
    state where `pieces` cuts it)."""
    by_region: dict[str, list[ByteLayout]] = {}
    for pattern in reading(plan).patterns(plan, wanted, origin, pieces):
        by_region.setdefault(pattern.region, []).append(pattern)
    return by_region


def region_sizes(plan: Plan) -> list[tuple[str, int, str]]:
    """(name, bytes, location) of every allocation of the plan: a pool's one buffer, or each
    layer's buffer of an SGLang per-layer pool."""
    return reading(plan).regions(plan)
