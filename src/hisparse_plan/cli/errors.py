"""Turning any refusal into one readable line that quotes at most a short excerpt of input."""

from __future__ import annotations

import re
from typing import Final

from pydantic import ValidationError

from hisparse_plan.cli.printable import printable
from hisparse_plan.models.json_input import EXCERPT_CHARS, cut, excerpt, path_step

LINE_CHARS: Final = 1000
"""The longest error line: a safety net for messages that quote a value we did not cut."""
_LONG_RUN: Final = re.compile(rf"\S{{{EXCERPT_CHARS + 1},}}")
DIGITS_HINT: Final = re.compile(r";?\s*use sys\.set_int_max_str_digits\(\) to increase the limit")
"""Python's advice to programmers when an integer has too many digits: not the operator's."""


class CommandError(Exception):
    """A refusal the CLI itself makes: conflicting flags, a missing extra. Exit code 2."""


class CheckFailed(Exception):
    """A check ran and found a fault (verify): exit code 1, unlike a refusal's 2."""


def validation_line(error: ValidationError) -> str:
    """`path: message (got value)` for the first error, the value cut to a short excerpt."""
    first = error.errors(include_url=False)[0]
    whole = "request" if error.title == "PlanRequest" else error.title  # an empty loc
    path = "".join(path_step(part) for part in first["loc"]).lstrip(".") or whole
    more = f" (and {error.error_count() - 1} more)" if error.error_count() > 1 else ""
    message = cut(first["msg"].removeprefix("Value error, "), EXCERPT_CHARS)
    got = first.get("input")
    # A whole object is no help in one line (and may be the whole request).
    shown = "" if isinstance(got, dict | list) or first["type"] == "json_invalid" else (
        f" (got {excerpt(got)})"
    )
    return f"{path}: {message}{shown}{more}"


def one_line(error: BaseException) -> str:
    """A message without newlines, never longer than about LINE_CHARS characters."""
    if isinstance(error, ValidationError):
        text = validation_line(error)
    elif isinstance(error, OSError) and error.filename is not None and error.strerror:
        text = f"{error.filename}: {error.strerror}"
    else:
        text = str(error)
    # A value quoted whole by a message we did not write is one long run without spaces.
    text = _LONG_RUN.sub(lambda run: cut(run.group(), EXCERPT_CHARS), text)
    text = " ".join(cut(DIGITS_HINT.sub("", text), LINE_CHARS).split())
    return printable(text) or type(error).__name__


def too_many_digits(error: BaseException) -> bool:
    """Python refused to convert an integer of more digits than it allows (4300 by default):
    input that spells a number absurdly long, not a bug."""
    return isinstance(error, ValueError) and "integer string conversion" in str(error)
