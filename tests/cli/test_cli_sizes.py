"""Sizes and token counts as the CLI reads and prints them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hisparse_plan.cli.sizes import exact_size, format_size, parse_size, parse_tokens
from hisparse_plan.models import INT64_MAX

GIB = 2**30
BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


@pytest.mark.parametrize(("text", "expected"), [
    ("60GiB", 60 * GIB),
    ("1.5TiB", 3 * 2**39),
    ("512G", 512 * GIB),  # a bare G is binary, like free -g and docker --memory
    ("512GB", 512 * 10**9),
    ("4096", 4096),
    ("64gi", 64 * GIB),
    ("  2 TiB ", 2 * 2**40),
    ("0.5k", 512),
    ("0.1GiB", 107374182),  # fractions of a byte are dropped
    ("1B", 1),
])
def test_sizes(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "-1", "1e9", "60XB", "GiB", "1.2.3G", "60 G B", "nan"])
def test_bad_sizes(text: str) -> None:
    with pytest.raises(ValueError, match="invalid size"):
        parse_size(text)


def test_sizes_stop_at_int64() -> None:
    assert parse_size(str(INT64_MAX)) == INT64_MAX
    with pytest.raises(ValueError, match="at most"):
        parse_size(f"{INT64_MAX + 1}")


@given(st.integers(0, 2**20), st.sampled_from(sorted(BINARY)), st.sampled_from(["", "i", "iB"]))
def test_binary_units_scale_by_1024(count: int, letter: str, suffix: str) -> None:
    for case in (str.upper, str.lower):
        assert parse_size(f"{count}{case(letter + suffix)}") == count * BINARY[letter]


@given(st.integers(0, 2**20), st.sampled_from(sorted(BINARY)))
def test_decimal_units_scale_by_1000(count: int, letter: str) -> None:
    power = " KMGT".index(letter)
    assert parse_size(f"{count}{letter}B") == count * 1000**power


@given(st.integers(0, INT64_MAX))
def test_exact_size_round_trips(value: int) -> None:
    assert parse_size(exact_size(value)) == value
    assert parse_size(str(value)) == value


@given(st.integers(64 * 1024, 2**60 - 1))
def test_format_size_never_rounds_up(value: int) -> None:
    number, unit = format_size(value).split()
    scale = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40, "PiB": 2**50}[unit]
    shown = parse_size(f"{number}{unit}")
    # Cut to hundredths of the unit, and the parse drops a fraction of a byte.
    assert shown <= value < shown + scale / 100 + 1
    assert 1 <= float(number) < 1024


def test_format_size_examples() -> None:
    assert format_size(60 * GIB) == "60 GiB"
    assert format_size(68717395968) == "63.99 GiB"  # 64 GiB less a partial host block
    assert format_size(41984) == "41984 B"
    assert exact_size(60 * GIB) == "60GiB"


@pytest.mark.parametrize(("text", "expected"), [
    ("163840", 163840), ("128k", 131072), ("128K", 131072), ("1m", 2**20),
])
def test_tokens(text: str, expected: int) -> None:
    assert parse_tokens(text) == expected


@pytest.mark.parametrize("text", ["", "12.5k", "128kb", "-4", "lots"])
def test_bad_tokens(text: str) -> None:
    with pytest.raises(ValueError, match="invalid token count"):
        parse_tokens(text)
