"""Validating a request's layers once per distinct spec content.

A model of 61 decoder layers lists the same two or three layer specs 122 times; pydantic would
validate (and derive the page of) each copy again. Here every distinct content is validated by
the same validator, and layers whose input is equal to it, type for type, share its model: the
result is what validating each copy would give, because validation reads nothing but the
content. Any failure validates the input again as given, layer by layer, so error reports are
exactly those of the plain validation.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Final, cast

from pydantic import TypeAdapter, ValidationError, ValidatorFunctionWrapHandler

from hisparse_plan.models.base import LayerName

_SCALARS: Final = frozenset({str, int, bool, float, type(None)})
"""Types whose equal values validate alike whatever the mode (1 == True is told apart by type)."""

_NAMES: Final = TypeAdapter(list[LayerName], config={"strict": True})


def content_key(value: object) -> Hashable:
    """A key equal for two inputs exactly when they have equal content of the same types at
    every level; anything other than plain JSON-like data is keyed by its identity."""
    if type(value) is dict:
        types = tuple(map(type, value.values()))
        if _SCALARS.issuperset(types):
            return (dict, *value.items(), *types)
        return (dict, *((key, type(key), content_key(item)) for key, item in value.items()))
    if type(value) is list:
        return (list, *map(content_key, value))
    if type(value) in _SCALARS:
        return (type(value), value)
    return (object, id(value))


def _flat_keys(specs: list[object]) -> list[Hashable] | None:
    """A key per spec, equal exactly when `content_key` is, when all specs are dicts of scalars
    (the usual request): made without a Python call per layer; None when some are not.

    A key is (dict, *names, *values, *types): flat, so it is quick to build and to hash."""
    if set(map(type, specs)) != {dict}:
        return None
    dicts = cast("list[dict[object, object]]", specs)
    keys = [(dict, *spec, *spec.values(), *map(type, spec.values())) for spec in dicts]
    shapes = {key[1 + 2 * (len(key) - 1) // 3:] for key in keys}
    # Only a few distinct type rows: checking them covers every layer.
    if all(_SCALARS.issuperset(types) for types in shapes):
        return cast("list[Hashable]", keys)  # a list is invariant; the keys are tuples
    return None


def validate_distinct(value: object, handler: ValidatorFunctionWrapHandler) -> object:
    """`handler(value)` for a dict of layers, with each distinct layer content validated once
    (a wrap validator's body)."""
    if type(value) is not dict or len(value) < 2:
        return handler(value)
    specs = list(value.values())
    # The same input object again (an adapter's shared dicts) needs no key of its own.
    objects = dict(zip(map(id, specs), specs, strict=True))
    distinct = list(objects.values())
    keys = _flat_keys(distinct)
    if keys is None:
        keys = list(map(content_key, distinct))
    if len(distinct) < len(specs):
        key_of_object = dict(zip(objects, keys, strict=True))
        keys = list(map(key_of_object.__getitem__, map(id, specs)))
    first_of_key: dict[Hashable, object] = {}
    first_names = [
        first_of_key.setdefault(key, name) for key, name in zip(keys, value, strict=True)
    ]
    if len(first_of_key) == len(value):
        return handler(value)  # nothing repeats: nothing to share
    try:
        # Every name is checked, by the rule the field has for its keys.
        names = _NAMES.validate_python(list(value))
        checked = handler({name: value[name] for name in first_of_key.values()})
    except ValidationError:
        return handler(value)  # report every error as the plain validation does
    return dict(zip(names, map(checked.__getitem__, first_names), strict=True))
