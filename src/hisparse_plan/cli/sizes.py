"""Sizes and token counts as operators type them: `60GiB`, `1.5TiB`, `512G`, `128k`.

Binary units are the default because memory is sold and reported in them: `K`, `M`, `G`, `T`,
`P`, `E` (and `KiB` ... `EiB`, `Ki` ... `Ei`) are powers of 1024, as in `free -g` or Docker's
`--memory 512g`. Decimal units are spelled with a `B`: `KB`, `MB`, `GB`, `TB`, `PB` are powers of
1000. Units are case-insensitive; a bare number is bytes. Fractions of a byte are dropped.
Every size and count stops at int64 (2**63 - 1), the most an engine's byte offset can hold.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Final

from hisparse_plan.models import INT64_MAX

_BINARY: Final = {"k": 1, "m": 2, "g": 3, "t": 4, "p": 5, "e": 6}
UNITS: Final[dict[str, int]] = {"": 1, "b": 1}
for _letter, _power in _BINARY.items():
    UNITS[_letter] = UNITS[f"{_letter}i"] = UNITS[f"{_letter}ib"] = 1024**_power
    UNITS[f"{_letter}b"] = 1000**_power

SIZE_HELP: Final = (
    "SIZE is bytes, or a number with a unit: K, M, G, T (also KiB, MiB, GiB, TiB) are powers of "
    "1024; KB, MB, GB, TB are powers of 1000 (60GiB, 1.5TiB, 512G, 4096)"
)
_NUMBER: Final = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*")
_BINARY_NAMES: Final = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def parse_size(text: str) -> int:
    """Bytes; ValueError (with the accepted forms) for anything else."""
    match = _NUMBER.fullmatch(text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in UNITS:
        raise ValueError(
            f"invalid size {text!r}: expected bytes or a number with a unit such as "
            "60GiB, 1.5TiB, 512G (G = GiB; GB = 10**9)"
        )
    value = int(Fraction(match.group(1)) * UNITS[unit])
    if value > INT64_MAX:
        raise ValueError(f"invalid size {text!r}: expected at most {INT64_MAX} bytes")
    return value


def parse_tokens(text: str) -> int:
    """A token count: a whole number, or one with `k` (1024) or `m` (1024**2): 128k = 131072."""
    match = re.fullmatch(r"\s*(\d+)\s*([kKmM]?)\s*", text)
    if match is None:
        raise ValueError(
            f"invalid token count {text!r}: expected a whole number such as 163840 or 128k"
        )
    scale = {"": 1, "k": 1024, "m": 1024**2}[match.group(2).lower()]
    value = int(match.group(1)) * scale
    if value > INT64_MAX:
        raise ValueError(f"invalid token count {text!r}: expected at most {INT64_MAX}")
    return value


def format_size(value: int) -> str:
    """Bytes in the largest binary unit, whole or cut (never rounded up) to two decimals:
    `60 GiB`, `2.44 MiB`, `63.99 GiB` for a pool just short of 64 GiB; below 64 KiB the exact
    count reads better (`41984 B`)."""
    if value < 64 * 1024:
        return f"{value} B"
    power = min((value.bit_length() - 1) // 10, len(_BINARY_NAMES) - 1)
    whole, rest = divmod(value, 1024**power)
    if rest == 0:
        return f"{whole} {_BINARY_NAMES[power]}"
    hundredths = value * 100 // 1024**power
    return f"{hundredths // 100}.{hundredths % 100:02d} {_BINARY_NAMES[power]}"


def exact_size(value: int) -> str:
    """A spelling that parse_size reads back to exactly `value`: `60GiB`, or plain bytes."""
    for power in range(len(_BINARY_NAMES) - 1, 0, -1):
        whole, rest = divmod(value, 1024**power)
        if rest == 0 and whole:
            return f"{whole}{_BINARY_NAMES[power]}"
    return str(value)
