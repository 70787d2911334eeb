"""Each engine's reading of its plans for a transfer: what one rank offers (its facts) and where
each logical byte lives (check_transfer's patterns, its regions). The one module of
exchange/transfer/ outside those readings that names an engine: a new engine's plan type adds
its reading here."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from hisparse_plan.errors import PlanError
from hisparse_plan.exchange.transfer.facts.byte_layout import ByteLayout, Origin, StatePieces
from hisparse_plan.exchange.transfer.facts.rank_facts import RankFacts
from hisparse_plan.exchange.transfer.facts.sglang_facts import sglang_facts
from hisparse_plan.exchange.transfer.facts.sglang_places import sglang_patterns, sglang_regions
from hisparse_plan.exchange.transfer.facts.vllm_facts import vllm_facts
from hisparse_plan.exchange.transfer.facts.vllm_places import vllm_patterns, vllm_regions
from hisparse_plan.models import KVCachePlan
from hisparse_plan.models.engines import SGLangPlan


@dataclass(frozen=True, slots=True)
class Reading:
    """How a transfer reads one plan type (each callable takes a plan of that type)."""

    facts: Callable[[Any], RankFacts]
    patterns: Callable[[Any, set[str], Origin, StatePieces], list[ByteLayout]]
    regions: Callable[[Any], list[tuple[str, int, str]]]


READINGS: Final[Mapping[type, Reading]] = {
    KVCachePlan: Reading(vllm_facts, vllm_patterns, vllm_regions),
    SGLangPlan: Reading(sglang_facts, sglang_patterns, sglang_regions),
}
"""Plan type -> its reading."""


def reading(plan: object) -> Reading:
    """The reading of `plan`'s type; anything but a plan is refused naming what it got."""
    found = READINGS.get(type(plan))
    if found is None:
        raise PlanError(f"expected a plan ({', '.join(kind.__name__ for kind in READINGS)}), "
                        f"got {type(plan).__name__}", field="plans")
    return found
