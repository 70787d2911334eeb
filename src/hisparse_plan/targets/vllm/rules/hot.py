"""The hot buffer, and the units and packs that become resident and hot groups (SPEC 5.4, 5.5)."""

from __future__ import annotations

from itertools import pairwise
from typing import NamedTuple

from hisparse_plan.errors import PlanError
from hisparse_plan.models import MLASpec

MAX_HOT_ROWS = 32768
"""Hot slot indices are int16."""


class HotBuffer(NamedTuple):
    top_k: int
    rows: int
    warnings: list[str]


def hot_buffer(
    source_specs: list[MLASpec],
    index_topk: int,
    max_decode_query_len: int,
    device_buffer_size: int | None,
    block_size: int,
) -> HotBuffer:
    """Rows each request's hot buffer holds (SPEC 5.4), and a warning when some are wasted."""
    top_k = max(
        index_topk if spec.topk_buffer_width is None else spec.topk_buffer_width
        for spec in source_specs
    )
    queries = max_decode_query_len
    minimum = queries * top_k
    field = "hisparse.device_buffer_size"
    rows = (queries + 1) * top_k if device_buffer_size is None else device_buffer_size
    given = "" if device_buffer_size is not None else (
        "the default (max_decode_query_len + 1) * top-k = "
    )
    if rows < minimum:
        raise PlanError(
            f"{field}: {queries} decode query rows each select top-k {top_k} rows, so expected "
            f"at least {minimum} rows, got {rows}",
            field=field,
        )
    if rows > MAX_HOT_ROWS:
        hint = (
            f"; set it between {minimum} and {MAX_HOT_ROWS}" if minimum <= MAX_HOT_ROWS else ""
        )
        raise PlanError(
            f"{field}: expected at most {MAX_HOT_ROWS} rows (hot slots are int16), "
            f"got {given}{rows}{hint}",
            field=field,
        )
    warnings = []
    if rows % block_size:
        wasted = block_size - rows % block_size
        warnings.append(
            f"{field} {rows} is not a multiple of block_size {block_size}: the last hot block "
            f"of every request leaves {wasted} rows unused"
        )
    return HotBuffer(top_k, rows, warnings)


class HotPack(NamedTuple):
    """Source layers whose resident and hot pages share one group: one page size, in order."""

    names: list[str]
    page: int


def hot_packs(source: list[tuple[str, MLASpec]], indexer_page: int) -> list[HotPack]:
    """Resident/hot packs: index-sharing units packed greedily, in order, into indexer blocks.

    A unit is a leader and the non-leaders after it (they share one indexer's top-k); a pack
    grows while its pages fit one block of the indexer group. Units are never split, so a unit
    larger than an indexer block gets a pack of its own.
    """
    starts: list[int] = []  # where each unit begins, in source order
    sizes: list[int] = []
    for position, (_, spec) in enumerate(source):
        if spec.is_index_group_leader or not starts:
            starts.append(position)
            sizes.append(spec.page_size_bytes)
        else:
            sizes[-1] += spec.page_size_bytes
    bounds: list[int] = []  # where each pack begins
    filled = 0
    for start, size in zip(starts, sizes, strict=True):
        if not bounds or filled + size > indexer_page:
            bounds.append(start)
            filled = 0
        filled += size
    bounds.append(len(source))
    packs = [source[begin:end] for begin, end in pairwise(bounds)]
    return [_one_page(pack) for pack in packs]


def _one_page(pack: list[tuple[str, MLASpec]]) -> HotPack:
    pages = {spec.page_size_bytes for _, spec in pack}
    if len(pages) > 1:
        first_page = pack[0][1].page_size_bytes
        name, odd = next((n, s) for n, s in pack if s.page_size_bytes != first_page)
        shown = sorted(pages)
        listed = ", ".join(map(str, shown[:4])) + (f", ... ({len(shown)} sizes)"
                                                   if len(shown) > 4 else "")
        raise PlanError(
            f"layers[{name!r}]: the hot pack {pack[0][0]!r} .. {pack[-1][0]!r} mixes page sizes "
            f"[{listed}]; expected one page size per resident/hot group, like "
            f"{pack[0][0]!r} ({first_page} bytes), got {odd.page_size_bytes}",
            field=f"layers[{name!r}]",
        )
    return HotPack([name for name, _ in pack], pages.pop())
