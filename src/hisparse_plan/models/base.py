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
    def trusted(cls, fields: dict[str, object]) -> Self:
        """Build from values already checked, skipping validation; every field must be given.

        For the planner's hot path, where validation (or pydantic's `model_construct`) costs
        more than the planning itself. It fills the same slots `model_construct` fills; tests
        validate every plan's JSON dump back into an equal plan.
        """
        model = _new_object(cls)
        _set_attribute(model, "__dict__", fields)
        _set_fields_set(model, set(fields))
        _set_extra(model, None)
        _set_private(model, None)
        return model


_new_object = object.__new__
_set_attribute = object.__setattr__
# BaseModel's own slots, set through their descriptors (a frozen model refuses setattr).
_set_fields_set = BaseModel.__dict__["__pydantic_fields_set__"].__set__
_set_extra = BaseModel.__dict__["__pydantic_extra__"].__set__
_set_private = BaseModel.__dict__["__pydantic_private__"].__set__
