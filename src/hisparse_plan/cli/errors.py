"""Turning any refusal into one readable line."""

from __future__ import annotations

from pydantic import ValidationError


class CommandError(Exception):
    """A refusal the CLI itself makes: conflicting flags, a missing extra. Exit code 2."""


class CheckFailed(Exception):
    """A check ran and found a fault (verify): exit code 1, unlike a refusal's 2."""


def one_line(error: BaseException) -> str:
    """A message without newlines; pydantic errors become `path: message (got value)`."""
    if isinstance(error, ValidationError):
        first = error.errors()[0]
        path = ".".join(str(part) for part in first["loc"]) or "request"
        more = f" (and {error.error_count() - 1} more)" if error.error_count() > 1 else ""
        got = first.get("input")
        shown = "" if isinstance(got, dict | list) else f" (got {got!r})"
        return f"{path}: {first['msg']}{shown}{more}"
    if isinstance(error, OSError) and error.filename is not None and error.strerror:
        return f"{error.filename}: {error.strerror}"
    text = " ".join(str(error).split())
    return text or type(error).__name__
