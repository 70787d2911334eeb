"""A model whose `model_validate_json` reads its text as every untrusted file is read: bounded
in size and depth, no key twice, and the text parsed once into the dict the model validates
(its unknown keys then refused in one error by `Model`, not one error object each)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, Self

from pydantic.config import ExtraValues

from hisparse_plan.errors import PlanError
from hisparse_plan.models.base import Model
from hisparse_plan.models.json_input import MAX_DEPTH, load_json_object

MAX_TEXT: Final = 64 * 2**20
"""Characters (or bytes) of JSON text a model reads: the CLI's file limit."""


class JsonTextModel(Model):
    """`Model`, with its JSON text read strictly (`load_json_object`)."""

    @classmethod
    def model_validate_json(
        cls,
        json_data: str | bytes | bytearray,
        *,
        strict: bool | None = None,
        extra: ExtraValues | None = None,
        context: object | None = None,
        by_alias: bool | None = None,
        by_name: bool | None = None,
    ) -> Self:
        what = cls.__name__
        if not isinstance(json_data, str | bytes | bytearray):
            # Typed callers cannot get here; an untyped one gets a PlanError, not json's
            # TypeError, like every other input a model refuses.
            raise PlanError(f"{what}: expected JSON text as str, bytes or bytearray, got "
                            f"{type(json_data).__name__}", field=what)
        return cls._validate_json_text(
            bytes(json_data) if isinstance(json_data, bytearray) else json_data,
            lambda data: cls.model_validate(data, strict=strict, extra=extra, context=context,
                                            by_alias=by_alias, by_name=by_name))

    @classmethod
    def _validate_json_text(cls, text: str | bytes,
                            validate: Callable[[dict[str, Any]], Self]) -> Self:
        """`validate` of the text's object, read as every untrusted file is read."""
        what = cls.__name__
        if len(text) > MAX_TEXT:
            raise PlanError(f"{what}: {len(text)} characters of JSON; expected at most "
                            f"{MAX_TEXT}", field=what)
        return validate(load_json_object(text, what=what, max_depth=MAX_DEPTH))
