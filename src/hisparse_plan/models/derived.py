"""Derived fields: computed from their siblings, stored, and checked when given."""

from __future__ import annotations

from pydantic import BaseModel

from hisparse_plan.models.base import INT64_MAX


def store_derived(model: BaseModel, field: str, value: int, formula: str) -> None:
    """Set `field` to `value`; a value the input gave must already agree.

    Called from `model_post_init`, which runs once when a model is built from input (a built
    model nested in another is reused as is); a ValueError there becomes a ValidationError.
    """
    if value > INT64_MAX:
        raise ValueError(f"{field}: {formula} = {value} does not fit in int64")
    if field in model.model_fields_set:
        given = getattr(model, field)
        if given != value:
            raise ValueError(f"{field}: expected {value} ({formula}), got {given}")
    # The models are frozen; this is the one place a derived value is written.
    object.__setattr__(model, field, value)
