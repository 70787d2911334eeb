"""The byte strides of a page's logical axes in each physical layout (rules/strides.py), and the
integer helpers (rules/arith.py), judged by arithmetic written out here: an axis's stride is the
product of the extents of the axes inside it, unless a fixed stride or a padded page says
otherwise."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hisparse_plan.errors import PlanError
from hisparse_plan.models.layout import Axis, KVCacheLayout
from hisparse_plan.rules.arith import ceil_div, require_int64, round_up
from hisparse_plan.rules.strides import axis_strides

EXTENTS: dict[Axis, int] = {"L": 3, "B": 5, "H": 2, "N": 16, "C": 256}


@pytest.mark.parametrize("layout", list(KVCacheLayout))
def test_each_axis_strides_over_the_axes_inside_it(layout: KVCacheLayout) -> None:
    axes = layout.axes
    expected: dict[Axis, int] = {}
    for index, axis in enumerate(axes):
        expected[axis] = math.prod([EXTENTS[inner] for inner in axes[index + 1:]])
    assert axis_strides(layout, EXTENTS) == expected


def test_the_written_out_strides_of_two_layouts() -> None:
    # LBNHC: C 1, H 256, N 2 x 256, B 16 x 512, L 5 x 8,192.
    assert axis_strides(KVCacheLayout.LBNHC, EXTENTS) == {
        "C": 1, "H": 256, "N": 512, "B": 8_192, "L": 40_960}
    # BHLNC: C 1, N 256, L 16 x 256, H 3 x 4,096, B 2 x 12,288.
    assert axis_strides(KVCacheLayout.BHLNC, EXTENTS) == {
        "C": 1, "N": 256, "L": 4_096, "H": 12_288, "B": 24_576}


def test_a_fixed_block_stride_carries_outward() -> None:
    strides = axis_strides(KVCacheLayout.BLNHC, EXTENTS, fixed={"B": 100_000})
    assert strides["B"] == 100_000
    assert strides["L"] == 16 * 2 * 256
    strides = axis_strides(KVCacheLayout.LBNHC, EXTENTS, fixed={"B": 9_000})
    assert (strides["B"], strides["L"]) == (9_000, 5 * 9_000)


def test_a_padded_page_spaces_the_pages_of_a_block_compact_layout() -> None:
    # The page is 16 x 2 x 256 = 8,192 bytes; padded to 10,000, each block's page starts
    # 10,000 bytes after the last, and a layer holds 5 of them.
    strides = axis_strides(KVCacheLayout.LBNHC, EXTENTS, padded_page=10_000)
    assert (strides["B"], strides["L"]) == (10_000, 50_000)


@given(st.integers(0, 10**18), st.integers(1, 10**9))
def test_ceil_div_and_round_up(value: int, multiple: int) -> None:
    quotient = ceil_div(value, multiple)
    assert (quotient - 1) * multiple < value <= quotient * multiple or value == quotient == 0
    rounded = round_up(value, multiple)
    assert rounded % multiple == 0
    assert value <= rounded < value + multiple


def test_require_int64_names_the_field() -> None:
    assert require_int64(2**63 - 1, "a size") == 2**63 - 1
    with pytest.raises(PlanError, match="a size"):
        require_int64(2**63, "a size", field="device.available_bytes")
