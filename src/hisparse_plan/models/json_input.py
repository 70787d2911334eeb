"""Reading JSON strictly (requests, and every untrusted file: see `untrusted_json`): a key
named twice in one object is an error, not a silent "last one wins", and no error quotes more
than a short excerpt of the input.

Python's `json` keeps the last of two equal keys, and so does pydantic's parser; a request whose
meaning depends on which copy a parser keeps is refused instead, with the key and its path.

`validate_request_json` proves the absence of duplicates without the per-object hook when it can:
every member of every object in the text has its own ':' outside strings, so a parse that kept
as many keys as the text has ':' characters dropped none.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Callable, Iterable
from typing import Any, Final, TypeVar

from pydantic_core import from_json

from hisparse_plan.errors import PlanError

EXCERPT_CHARS: Final = 200
"""The most characters of input any error message quotes."""
MAX_DEPTH: Final = 64
"""Levels of nesting untrusted JSON may have: requests and plans nest at most 5, the Hub's
config.json files about as many; a reader that recurses on what was parsed (transformers does,
on a config) stays far from Python's stack limit."""

T = TypeVar("T")

_MANY_OBJECTS: Final = 16
"""An object with at least this many members, all of them objects (a request's layers), has
its members' keys counted in bulk, without looking inside them."""


def cut(text: str, limit: int = EXCERPT_CHARS) -> str:
    """`text` cut in the middle to at most about `limit` characters, saying how much was left
    out; a 14 MB input must never be echoed whole into an error line."""
    if len(text) <= limit:
        return text
    keep = max(limit - 40, 20)
    head, tail = keep * 2 // 3, keep - keep * 2 // 3
    return f"{text[:head]}...<{len(text) - head - tail} characters cut>...{text[-tail:]}"


def excerpt(value: object, limit: int = EXCERPT_CHARS) -> str:
    """`repr(value)`, cut to at most about `limit` characters."""
    return cut(repr(value), limit)


class _Duplicated(dict[str, Any]):
    """An object in which `key` was named more than once (marked, found again after parsing)."""

    key: str


def path_step(key: str | int) -> str:
    """One step of a field path: `.name`, `['a.b']` for a key that is not a name, `[3]`."""
    if isinstance(key, int):
        return f"[{key}]"
    if key.isidentifier() and len(key) <= 80:
        return f".{key}"
    return f"[{excerpt(key, 80)}]"


def _find_duplicate(data: object) -> tuple[str, str] | None:
    """(key, path of the object) of the first marked object, in document order."""
    # Depth-first with an explicit stack: the input may nest deeply.
    stack: list[tuple[object, str]] = [(data, "")]
    while stack:
        node, where = stack.pop()
        if isinstance(node, _Duplicated):
            return node.key, where
        if isinstance(node, dict):
            stack.extend((child, where + path_step(k)) for k, child in reversed(node.items()))
        elif isinstance(node, list):
            stack.extend((child, f"{where}[{i}]") for i, child in reversed(list(enumerate(node))))
    return None


def nested_deeper(data: object, limit: int) -> bool:
    """Whether parsed JSON `data` holds a container more than `limit` levels deep (the top
    level is level 1). Walked with an explicit stack, so any depth is measured safely."""
    stack: list[tuple[object, int]] = [(data, 1)]
    while stack:
        node, depth = stack.pop()
        children: Iterable[object]
        if isinstance(node, dict):
            children = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


def proven_parse(text: str | bytes) -> dict[str, Any] | None:
    """The object in `text` by pydantic's parser (faster than `json`'s, and lighter: no list
    of pairs an object) when that parse provably dropped no key: every member of every object
    has its own ':' outside strings, so a parse that kept as many keys as the text has ':'
    characters kept them all (a key named twice loses a member). None otherwise: text it
    refuses, another top level, or a ':' inside a string; the strict reading decides. NaN
    reads as json reads it: the models refuse it naming the field."""
    try:
        if isinstance(text, bytes) and json.detect_encoding(text) == "utf-8":
            data = from_json(text)
            colons = text.count(b":")
        else:
            decoded = text if isinstance(text, str) else text.decode(
                json.detect_encoding(text), "surrogatepass")
            data = from_json(decoded)
            colons = decoded.count(":")
    except (ValueError, RecursionError):
        return None
    if type(data) is not dict or _keys_at_most_kept(data) != colons:
        return None
    return data


def load_json_object(
    text: str | bytes, *, what: str = "request", max_depth: int | None = None
) -> dict[str, Any]:
    """Parse JSON text (str, or bytes in UTF-8/16/32) that must be one object: `what` it is
    (a request, a plan, a config) names it in refusals, and is the `field` of those about the
    text as a whole.

    Raises `PlanError` for text that is not JSON, for a top level that is not an object, for
    any object that names a key twice (`field` is the key's path, such as
    ``layers['model.layers.0.self_attn.attn'].kind``) and, when `max_depth` is given, for
    nesting deeper than that. Messages quote at most about `EXCERPT_CHARS` characters of the
    input.
    """
    duplicated = False

    def pairs_hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal duplicated
        result = dict(pairs)
        if len(result) == len(pairs):  # the common case, decided without a Python loop
            return result
        duplicated = True
        seen: set[str] = set()
        key = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        marked = _Duplicated(pairs)
        marked.key = key
        return marked

    refuse_byte_order_mark(text, what)
    deepest = f"a {what} nests a few levels" if max_depth is None else (
        f"expected at most {max_depth} levels")
    proven = proven_parse(text)
    if proven is not None:
        if max_depth is not None and nested_deeper(proven, max_depth):
            raise PlanError(f"{what}: nested more than {max_depth} levels deep; {deepest}",
                            field=what)
        return proven
    try:
        data = json.loads(text, object_pairs_hook=pairs_hook)
    except json.JSONDecodeError as error:
        near = error.doc[error.pos:error.pos + 40]
        raise PlanError(
            f"{what}: Invalid JSON: {error.msg} at line {error.lineno} column {error.colno} "
            f"(near {excerpt(near, 60)})",
            field=what,
        ) from None
    except RecursionError:
        raise PlanError(f"{what}: Invalid JSON: nested too deeply to read; {deepest}",
                        field=what) from None
    except ValueError as error:  # bytes that are not UTF-8, an integer of thousands of digits
        raise PlanError(f"{what}: Invalid JSON: {cut(str(error))}", field=what) from None
    if duplicated:
        found = _find_duplicate(data)
        if found is not None:
            key, where = found
            field = (where + path_step(key)).lstrip(".")
            inside = where.lstrip(".") or "the top-level object"
            raise PlanError(
                f"{field}: duplicate key {excerpt(key, 80)} in {inside}; expected each key "
                "once (which copy counts would depend on the parser)",
                field=field,
            )
    if max_depth is not None and nested_deeper(data, max_depth):
        raise PlanError(f"{what}: nested more than {max_depth} levels deep; {deepest}",
                        field=what)
    if not isinstance(data, dict):
        raise PlanError(
            f"{what}: expected a JSON object, got {type(data).__name__} "
            f"{excerpt(data, 80)}",
            field=what,
        )
    return data


def refuse_byte_order_mark(text: str | bytes, what: str) -> None:
    """UTF-8 JSON text starts without a byte order mark (RFC 8259): refused from bytes as from
    the CLI's decoded text (json reads a str with one as invalid, and would strip it from
    bytes). UTF-16 and UTF-32 bytes keep theirs: it is how their encoding is told."""
    marked = (text.startswith(codecs.BOM_UTF8) if isinstance(text, bytes)
              else text.startswith("\ufeff"))
    if marked:
        raise PlanError(f"{what}: Invalid JSON: Unexpected byte order mark at line 1 column 1; "
                        "expected UTF-8 JSON text without one", field=what)


def load_request_json(text: str | bytes) -> dict[str, Any]:
    """A request's JSON text as a dict: `load_json_object` for a request."""
    return load_json_object(text, what="request")


def _keys_at_most_kept(data: object) -> int:
    """A lower bound on the number of keys of all objects in parsed JSON `data`: exact for a
    plan request (whose layer specs hold no objects), lower for objects nested in the members of
    an object of many objects, which are not looked into."""
    total = 0
    stack = [data]
    while stack:
        node = stack.pop()
        if type(node) is dict:
            total += len(node)
            members = node.values()
            if len(node) >= _MANY_OBJECTS and set(map(type, members)) == {dict}:
                total += sum(map(len, members))
            else:
                stack.extend(item for item in members if type(item) in (dict, list))
        elif type(node) is list:
            stack.extend(item for item in node if type(item) in (dict, list))
    return total


def validate_request_json(text: str | bytes, validate: Callable[[dict[str, Any]], T]) -> T:
    """`validate(load_request_json(text))`, without the per-object duplicate check where the
    parse provably dropped no key (`proven_parse`): a duplicate key or bad JSON is reported as
    `load_request_json` reports it, before anything it may have caused."""
    refuse_byte_order_mark(text, "request")
    data = proven_parse(text)
    return validate(load_request_json(text) if data is None else data)
