"""Validating a request's layers once per distinct spec content.

A model of 61 decoder layers lists the same two or three layer specs 122 times; pydantic would
validate (and derive the page of) each copy again. Here every distinct content is validated by
the same validator, and layers whose input is equal to it, type for type, share its model: the
result is what validating each copy would give, because validation reads nothing but the
content. Any failure validates the input again as given, layer by layer, so error reports are
exactly those of the plain validation.

Two ways to find the copies: a model whose specs repeat with a short period (its decoder
layer's specs, in order) is recognised by comparing whole lists, with no Python code run per
layer; any other request is keyed layer by layer by content.
"""

from __future__ import annotations

from collections.abc import Hashable
from itertools import chain, cycle, islice
from typing import Final, cast

from pydantic import TypeAdapter, ValidationError, ValidatorFunctionWrapHandler

from hisparse_plan.models.base import LayerName

_SCALARS: Final = frozenset({str, int, bool, float, type(None)})
"""Types whose equal values validate alike whatever the mode (1 == True is told apart by type)."""

_MAX_PERIOD: Final = 8
"""The longest repeat of layer specs looked for (a decoder layer's specs, in order)."""

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


def _period(specs: list[object]) -> int | None:
    """The shortest p (at most `_MAX_PERIOD`) such that every spec has exactly the content of
    the spec p before it, types included, when all are dicts of scalars; None otherwise.

    Decided by comparing whole lists, so no Python bytecode runs per layer: a model repeats
    its decoder layer's one or two specs, in order, over every layer."""
    if set(map(type, specs)) != {dict}:
        return None
    dicts = cast("list[dict[object, object]]", specs)
    period = next((p for p in range(1, min(_MAX_PERIOD, len(dicts) - 1) + 1)
                   if dicts[p:] == dicts[:-p]), None)
    if period is None:
        return None
    # Dict equality takes 1, 1.0 and True as one value: the values' types must repeat too.
    # (They are listed in each dict's own key order; another order only fails this check.)
    types = list(map(type, chain.from_iterable(map(dict.values, dicts))))
    shift = sum(map(len, dicts[:period]))
    if shift and types[shift:] != types[:-shift]:
        return None
    # The types repeat with the period, so the first period's are all of them.
    return period if _SCALARS.issuperset(types[:shift]) else None


def validate_distinct(value: object, handler: ValidatorFunctionWrapHandler) -> object:
    """`handler(value)` for a dict of layers, with each distinct layer content validated once
    (a wrap validator's body)."""
    if type(value) is not dict or len(value) < 2:
        return handler(value)
    specs = list(value.values())
    period = _period(specs)
    if period is not None:
        firsts = list(value)[:period]
        try:
            names = _NAMES.validate_python(list(value))
            checked = handler({name: value[name] for name in firsts})
        except ValidationError:
            return handler(value)  # report every error as the plain validation does
        models = islice(cycle(map(checked.__getitem__, firsts)), len(names))
        return dict(zip(names, models, strict=True))
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
