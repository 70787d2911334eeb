"""Registration chunk arithmetic: edges on OS pages, never inside a page, chunks bounded."""

from __future__ import annotations

import bisect
import itertools

import pytest

pytest.importorskip("torch")  # the backend is an extra: skip without it

from hypothesis import given, settings
from hypothesis import strategies as st

import hisparse_plan as hp
from hisparse_plan.torch import BackendError, Chunk, host_trains, plan_chunks
from hisparse_plan.torch.hostmem.chunks import CHUNK_BYTES, MAX_REGISTRATION_BYTES, lowest_crossing
from hisparse_plan.views import Train
from support.torch_support import golden_plan, small_plan

GIB = 2**30
PAGE = 4096


def page_spans(plan: hp.KVCachePlan) -> tuple[list[int], list[int]]:
    """Every host page's [start, end), sorted by start, enumerated block by block."""
    spans = sorted(
        (train.start + block * train.period, train.start + block * train.period + train.run)
        for train in host_trains(plan)
        for block in range(train.count)
    )
    return [start for start, _ in spans], [end for _, end in spans]


def assert_sound(chunks: list[Chunk], size: int, limit: int, starts: list[int],
                 ends: list[int]) -> None:
    assert chunks[0].start == 0
    assert chunks[-1].end == size
    for chunk, following in itertools.pairwise(chunks):
        assert chunk.end == following.start
    for chunk in chunks:
        assert 0 < chunk.nbytes <= limit
    for chunk in chunks[:-1]:
        edge = chunk.end
        assert edge % PAGE == 0
        # The page starting last before the edge must end by it (pages are disjoint).
        before = bisect.bisect_left(starts, edge) - 1
        assert before < 0 or ends[before] <= edge, (edge, starts[before], ends[before])


def test_small_pool_is_one_chunk() -> None:
    plan = small_plan()
    assert plan.host_pool is not None
    size = plan.host_pool.size
    chunks = plan_chunks(size, host_trains(plan), chunk_bytes=CHUNK_BYTES, os_page=PAGE)
    assert chunks == [Chunk(0, 0, size)]


def test_deepseek_host_pool_in_one_gib_chunks() -> None:
    plan = golden_plan("deepseek_v32_fp8")
    assert plan.host_pool is not None
    size = plan.host_pool.size
    chunks = plan_chunks(size, host_trains(plan), chunk_bytes=GIB, os_page=PAGE)
    starts, ends = page_spans(plan)
    assert_sound(chunks, size, GIB, starts, ends)
    # Source pages are 41984 bytes: only every fourth page boundary is 4096-aligned, and each
    # chunk is as long as that allows (greedy), so 65 chunks of just under 1 GiB.
    aligned = 4 * 41984
    assert all(chunk.end % aligned == 0 for chunk in chunks[:-1])
    assert all(chunk.nbytes > GIB - aligned for chunk in chunks[:-1])
    assert len(chunks) == 65


def test_shared_pool_of_half_a_tib_in_default_chunks() -> None:
    plan = golden_plan("deepseek_v32_fp8_mtp3_shared_pool")
    assert plan.host_pool is not None
    size = plan.host_pool.size
    assert size > 7 * CHUNK_BYTES
    chunks = plan_chunks(size, host_trains(plan), chunk_bytes=CHUNK_BYTES, os_page=PAGE)
    assert len(chunks) == 8
    assert all(CHUNK_BYTES - 4 * 41984 < chunk.nbytes <= CHUNK_BYTES for chunk in chunks[:-1])
    # Checking every edge against the layers' trains (a million pages is too many to list).
    trains = host_trains(plan)
    for chunk in chunks[:-1]:
        assert chunk.end % PAGE == 0
        assert all(lowest_crossing(train, chunk.end) is None for train in trains)


def test_chunk_size_is_bounded() -> None:
    with pytest.raises(BackendError, match="register_chunk_bytes is 1024; expected at least"):
        plan_chunks(10 * PAGE, [], chunk_bytes=1024, os_page=PAGE)
    with pytest.raises(BackendError, match="which one cudaHostRegister call cannot take"):
        plan_chunks(10 * PAGE, [], chunk_bytes=MAX_REGISTRATION_BYTES, os_page=PAGE)


def test_no_edge_inside_a_chunk_is_an_error_naming_the_layer() -> None:
    # 3-page pages every 3 pages + 1 byte: no page boundary within two pages of the start.
    train = Train(start=0, run=3 * PAGE + 1, period=3 * PAGE + 1, count=8, tensor=0, layer="x",
                  group=0)
    with pytest.raises(BackendError, match=r"no OS-page boundary .* layer 'x'") as caught:
        plan_chunks(train.period * 8, [train], chunk_bytes=2 * PAGE, os_page=PAGE)
    assert "raise register_chunk_bytes above 8192" in str(caught.value)


def test_gaps_between_pages_are_edges() -> None:
    # 100-byte pages every 8192 bytes: every page boundary inside a gap is fine.
    train = Train(start=0, run=100, period=2 * PAGE, count=16, tensor=0, layer="x", group=0)
    chunks = plan_chunks(16 * 2 * PAGE, [train], chunk_bytes=3 * PAGE, os_page=PAGE)
    assert [chunk.end for chunk in chunks] == [3 * PAGE * k for k in range(1, 11)] + [32 * PAGE]


@st.composite
def layouts(draw: st.DrawFn) -> tuple[list[Train], int]:
    """Layer slabs of contiguous pages (the host layout), or pages with gaps."""
    trains: list[Train] = []
    position = 0
    for layer in range(draw(st.integers(1, 4))):
        run = draw(st.integers(1, 3 * PAGE))
        period = run + draw(st.sampled_from([0, 0, 1, 7, PAGE]))
        count = draw(st.integers(1, 40))
        trains.append(Train(position, run, period, count, 0, f"layer{layer}", 0))
        position += period * count
    return trains, position


@settings(max_examples=200)
@given(layouts(), st.integers(1, 24))
def test_generated_layouts(layout: tuple[list[Train], int], pages: int) -> None:
    trains, size = layout
    limit = pages * PAGE
    spans = sorted((t.start + b * t.period, t.start + b * t.period + t.run)
                   for t in trains for b in range(t.count))
    starts, ends = [s for s, _ in spans], [e for _, e in spans]
    try:
        chunks = plan_chunks(size, trains, chunk_bytes=limit, os_page=PAGE)
    except BackendError:
        # Refused only when some window of `limit` bytes really has no usable edge.
        usable = [e for e in range(PAGE, size, PAGE)
                  if not any(s < e < end for s, end in spans)]
        gaps = [b - a for a, b in zip([0, *usable], [*usable, size], strict=True)]
        assert max(gaps) > limit
        return
    assert_sound(chunks, size, limit, starts, ends)


@settings(max_examples=300)
@given(st.integers(0, 50), st.integers(1, 40), st.integers(0, 60), st.integers(1, 6),
       st.integers(0, 400))
def test_lowest_crossing_matches_enumeration(
    start: int, run: int, period: int, count: int, edge: int
) -> None:
    train = Train(start, run, period, count, 0, "x", 0)
    crossing = [start + b * period for b in range(count if period else 1)
                if start + b * period < edge < start + b * period + run]
    assert lowest_crossing(train, edge) == (min(crossing) if crossing else None)
