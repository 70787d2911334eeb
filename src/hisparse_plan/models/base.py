"""The shared model configuration and the integer types every size uses."""

from __future__ import annotations

from typing import Annotated, NoReturn, TypeVar

from pydantic import BaseModel, ConfigDict, Discriminator, Field, StringConstraints

K = TypeVar("K")
V = TypeVar("V")

GIB = 2**30
"""The one GiB: every size is bytes; GiB figures are for people (and host_pool_gib)."""

INT64_MAX = 2**63 - 1
"""Engines index pools with int64 offsets; no size, stride or offset may exceed it."""

PositiveInt = Annotated[int, Field(ge=1, le=INT64_MAX)]
ByteCount = Annotated[int, Field(ge=0, le=INT64_MAX)]
LayerName = Annotated[str, StringConstraints(min_length=1)]


def _kind_of(value: object) -> str | None:
    """The `kind` tag of a spec given as JSON (a dict) or as a built model."""
    kind = value.get("kind") if isinstance(value, dict) else getattr(value, "kind", None)
    return kind if isinstance(kind, str) else None


BY_KIND = Discriminator(
    _kind_of,
    custom_error_type="invalid_kind",
    custom_error_message=(
        "expected `kind` to be one of mla, full_attention, sliding_window, "
        "chunked_local_attention, sliding_window_mla, mamba (in a plan also uniform_type, "
        "hisparse_resident, hisparse_hot)"
    ),
)
"""Picks a spec class by its `kind`; cheaper than a field discriminator for built models,
which the planner passes around."""


class Model(BaseModel):
    """Frozen, strict, closed: JSON in and out without surprises."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


class FrozenDict(dict[K, V]):
    """A dict a validated model hands out read-only: planning results must not change under
    their callers, and a request must not change under its plan."""

    def _refuse(self, *args: object, **kwargs: object) -> NoReturn:
        raise TypeError(f"{type(self).__name__} is read-only: build a new request or plan")

    __setitem__ = __delitem__ = __ior__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse

    def __reduce__(self) -> tuple[type[FrozenDict[K, V]], tuple[dict[K, V]]]:
        return type(self), (dict(self),)


def freeze(model: BaseModel, field: str, value: dict[K, V]) -> None:
    """Store `value` read-only in a frozen model's `field` (from `model_post_init`)."""
    object.__setattr__(model, field, FrozenDict(value))
