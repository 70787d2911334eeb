"""What the plan-edit oracles report: a fault, named by its kind (for counting) and its detail."""

from __future__ import annotations

import math
from dataclasses import dataclass

INT64_MAX = 2**63 - 1
TOLERANCE = 1e-9
"""Relative slack for figures SGLang computes in floats (window ratios, cell sizes)."""


@dataclass(frozen=True, slots=True)
class Fault:
    kind: str
    """What broke, the same words for every instance (the report counts by it)."""
    detail: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.detail}"


class Faults(list[Fault]):
    """Faults found so far; `add` is the one way a check reports."""

    def add(self, kind: str, detail: str) -> None:
        self.append(Fault(kind, detail))


def near(a: float, b: float) -> bool:
    """Equal up to float rounding (both finite)."""
    if not (math.isfinite(a) and math.isfinite(b)):
        return False
    return abs(a - b) <= TOLERANCE * max(1.0, abs(a), abs(b))


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def round_up(a: int, b: int) -> int:
    return ceil_div(a, b) * b
