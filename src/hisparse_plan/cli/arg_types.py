"""argparse `type=` converters: a bad value becomes argparse's one-line error naming the flag."""

from __future__ import annotations

import argparse
from typing import Final, Literal

from hisparse_plan.cli.sizes import parse_size, parse_tokens
from hisparse_plan.models import INT64_MAX

AUTO: Final = "auto"
"""`--max-model-len auto`: the longest length that fits, as vLLM's auto (or -1)."""


def size_arg(text: str) -> int:
    """Bytes, from `60GiB`, `1.5TiB`, `512G`, `4096`."""
    try:
        return parse_size(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def positive_size(text: str) -> int:
    value = size_arg(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a size above 0, got {text!r}")
    return value


def positive_tokens(text: str) -> int:
    """A token count above 0, from `163840` or `128k`."""
    try:
        value = parse_tokens(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected at least 1 token, got {text!r}")
    return value


def max_model_len_arg(text: str) -> int | Literal["auto"]:
    """A token count above 0, or `auto` (vLLM's spelling; `-1` is its other one)."""
    if text.strip().lower() in (AUTO, "-1"):
        return AUTO
    return positive_tokens(text)


def _whole(text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid count {text!r}: expected a whole number"
        ) from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"expected at least {minimum}, got {value}")
    if value > INT64_MAX:
        raise argparse.ArgumentTypeError(f"expected at most {INT64_MAX}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    return _whole(text, 1)


def non_negative_int(text: str) -> int:
    return _whole(text, 0)
