"""Exact integer helpers for layout math: no floats touch a size, offset or stride."""

from __future__ import annotations

from hisparse_plan.errors import PlanError
from hisparse_plan.models.base import INT64_MAX


def ceil_div(numerator: int, denominator: int) -> int:
    return -(-numerator // denominator)


def round_up(value: int, multiple: int) -> int:
    return ceil_div(value, multiple) * multiple


def require_int64(value: int, what: str, *, field: str | None = None) -> int:
    """Refuse a byte count that an int64 offset could not address."""
    if value > INT64_MAX:
        raise PlanError(
            f"{what} is {value} bytes; expected at most {INT64_MAX} (int64 byte offsets)",
            field=field,
        )
    return value
