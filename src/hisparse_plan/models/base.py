"""The shared model configuration and the integer types every size uses."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Annotated, Final, NoReturn, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StringConstraints,
    ValidationError,
    model_validator,
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
MAX_LAYER_NAMES: Final = 2**18
"""Layers one request, or one tensor or group of a plan, may name: four for each of the 2^16
decoder layers a config may count (presets/layer_count.py), and past the 100,000 layers the
planner is measured at (benchmarks/bench_scale.py). Checked on the list's length before any
name is validated, so a file of a million layers is refused at the cost of reading it."""
MAX_PLAN_LAYER_NAMES: Final = 2**19
"""Layer names a plan's tensors may hold in all: a 100,000-layer HiSparse request's plan
names each layer and its derived ones (about three each) well inside it."""


def excerpt_key(key: object) -> str:
    """A key as an error quotes it: its repr, cut to 40 characters."""
    text = repr(key)
    return text if len(text) <= 40 else text[:30] + "...'"


def _kind_of(value: object) -> str | None:
    """The `kind` tag of a spec given as JSON (a dict) or as a built model."""
    kind = value.get("kind") if isinstance(value, dict) else getattr(value, "kind", None)
    return kind if isinstance(kind, str) else None


BY_KIND = Discriminator(
    _kind_of,
    custom_error_type="invalid_kind",
    custom_error_message=(
        "expected `kind` to be one of mla, full_attention, sliding_window, "
        "chunked_local_attention, cross_attention, sliding_window_mla, mamba (in a plan also "
        "uniform_type, hisparse_resident, hisparse_hot)"
    ),
)
"""Picks a spec class by its `kind`; cheaper than a field discriminator for built models,
which the planner passes around."""


UNKNOWN_KEYS_NAMED: Final = 3
"""Unknown keys an error names; the rest are counted."""
_KNOWN_KEYS: dict[type[BaseModel], frozenset[str]] = {}


def _known_keys(model: type[BaseModel]) -> frozenset[str]:
    known = _KNOWN_KEYS.get(model)
    if known is None:
        fields = model.model_fields
        known = frozenset(fields) | {f.alias for f in fields.values() if f.alias}
        _KNOWN_KEYS[model] = known
    return known


class Model(BaseModel):
    """Frozen, strict, closed: JSON in and out without surprises. A ValidationError's text
    leaves the input out (its `errors()` keep it): printing a two-million-key object costs
    more than reading it."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True,
                              hide_input_in_errors=True)

    @model_validator(mode="before")
    @classmethod
    def _refuse_unknown_keys(cls, data: object) -> object:
        """Keys no field names, refused before any field is validated, in one error naming
        the first few and their count: pydantic's own refusal makes an error object a key,
        so two million unknown keys would cost gigabytes before the first line is shown."""
        if type(data) is not dict:
            return data
        known = _known_keys(cls)
        if data.keys() <= known:  # one set comparison, in C
            return data
        unknown = [key for key, _ in zip(
            (key for key in data if key not in known), range(UNKNOWN_KEYS_NAMED), strict=False)]
        count = sum(key not in known for key in data)  # counted, not copied
        named = ", ".join(excerpt_key(key) for key in unknown)
        more = f" and {count - len(unknown)} more" if count > len(unknown) else ""
        raise ValueError(f"Extra inputs are not permitted: unknown key{'s' if count > 1 else ''} "
                         f"{named}{more}; expected only {cls.__name__}'s fields")


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


def is_zero(value: object) -> bool:
    """`exclude_if` of a count a later version added whose 0 is what plans before it meant."""
    return value == 0


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
