"""The shared model configuration and the integer types every size uses."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Annotated, NoReturn, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StringConstraints,
    ValidationError,
)

from hisparse_plan.errors import PlanError

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


class FrozenList(list[V]):
    """A list a validated model hands out read-only, for the same reason as `FrozenDict`: a
    request's Mamba state shapes changed after validation would reach the planner unchecked.
    Still a list, so it compares equal to one and dumps as a JSON array."""

    __slots__ = ("_sealed",)

    def __init__(self, items: Iterable[V] = ()) -> None:
        if getattr(self, "_sealed", False):
            self._refuse()
        super().__init__(items)
        self._sealed = True

    def _refuse(self, *args: object, **kwargs: object) -> NoReturn:
        raise TypeError(f"{type(self).__name__} is read-only: build a new request or plan")

    __setitem__ = __delitem__ = __iadd__ = __imul__ = _refuse
    append = extend = insert = pop = remove = clear = sort = reverse = _refuse

    def __reduce__(self) -> tuple[type[FrozenList[V]], tuple[list[V]]]:
        return type(self), (list(self),)


def _frozen_list(items: list[V]) -> list[V]:
    """`FrozenList(items)` without running its `__init__` in Python: every validated list of
    every model passes here (about fifty per plan)."""
    frozen: FrozenList[V] = list.__new__(FrozenList)
    list.extend(frozen, items)
    frozen._sealed = True
    return frozen


READ_ONLY = AfterValidator(_frozen_list)
"""Put in a list field's `Annotated[...]`: the validated list is handed out as a FrozenList."""


def is_none(value: object) -> bool:
    """`exclude_if` of an optional field a later version added: left out of the JSON when
    null, so plans and requests that do not use it dump as before."""
    return value is None


def is_empty(value: object) -> bool:
    """`exclude_if` of a collection field a later version added: left out of the JSON when
    empty, for the same reason as `is_none`."""
    return not value


def empty_frozen_list() -> list[V]:
    """A default for a READ_ONLY list field: already what validating `[]` gives."""
    return _frozen_list([])


@contextmanager
def built_for(field: str | None, what: str) -> Iterator[None]:
    """Models the planner builds from a request's layers (a uniform group, a padded page):
    a value they refuse, such as a page sum past int64, is a PlanError naming `field`, the
    request's layer, instead of a ValidationError about a model the caller never wrote.
    `what` says what was being built for it ("its uniform_type group"); with no `field`, the
    message starts with `what`."""
    try:
        yield
    except ValidationError as error:
        first = error.errors(include_url=False, include_input=False)[0]
        reason = str(first["msg"]).removeprefix("Value error, ")
        where = ".".join(str(step) for step in first["loc"])
        at = f"{where}: " if where and not reason.startswith(where) else ""
        named = "" if field is None else f"{field}: "
        raise PlanError(f"{named}{what} cannot be built: {at}{reason}", field=field) from error
