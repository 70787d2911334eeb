"""The shared model configuration and the integer types every size uses."""

from __future__ import annotations

from typing import Annotated, Self

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

INT64_MAX = 2**63 - 1
"""Engines index pools with int64 offsets; no size, stride or offset may exceed it."""

PositiveInt = Annotated[int, Field(ge=1, le=INT64_MAX)]
ByteCount = Annotated[int, Field(ge=0, le=INT64_MAX)]
LayerName = Annotated[str, StringConstraints(min_length=1)]


class Model(BaseModel):
    """Frozen, strict, closed: JSON in and out without surprises."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    @classmethod
    def trusted(cls, **fields: object) -> Self:
        """Build from values already checked, skipping validation; every field must be given.

        For the planner's hot path, where pydantic's `model_construct` costs more than the
        planning itself. Tests validate every plan's JSON dump back into an equal plan.
        """
        model = cls.__new__(cls)
        _set_slot(model, "__dict__", fields)
        _set_slot(model, "__pydantic_fields_set__", set(fields))
        _set_slot(model, "__pydantic_extra__", None)
        _set_slot(model, "__pydantic_private__", None)
        return model


_set_slot = object.__setattr__
