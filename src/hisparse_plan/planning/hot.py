"""The hot buffer, and the units and packs that become resident and hot groups (SPEC 5.4, 5.5)."""

from __future__ import annotations

from itertools import pairwise
from typing import NamedTuple

from hisparse_plan.errors import PlanError
from hisparse_plan.models import HisparseConfig, MLASpec, ModelConfig
from hisparse_plan.planning.buckets import LayerRun

MAX_HOT_ROWS = 32768
"""Hot slot indices are int16."""


def hot_buffer_rows(
    source_specs: list[MLASpec], model: ModelConfig, hisparse: HisparseConfig, block_size: int
) -> tuple[int, list[str]]:
    """Rows each request's hot buffer holds, and a warning when some are wasted."""
    top_k = max(
        model.index_topk if spec.topk_buffer_width is None else spec.topk_buffer_width
        for spec in source_specs
    )
    queries = hisparse.max_decode_query_len
    minimum = queries * top_k
    default = (queries + 1) * top_k
    field = "hisparse.device_buffer_size"
    rows = default if hisparse.device_buffer_size is None else hisparse.device_buffer_size
    given = "" if hisparse.device_buffer_size is not None else (
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
    return rows, warnings


class HotPack(NamedTuple):
    """Source layers whose resident and hot pages share one group: one page size, in order."""

    names: list[str]
    page: int


def hot_packs(runs: list[LayerRun], indexer_page: int) -> list[HotPack]:
    """Resident/hot packs: index-sharing units packed greedily, in order, into indexer blocks.

    A unit is a leader and the non-leaders after it (they share one indexer's top-k); a pack
    grows while its pages fit one block of the indexer group. Units are never split, so a unit
    larger than an indexer block gets a pack of its own.
    """
    unit_starts: list[int] = []  # each unit's first layer, in source order
    unit_bytes: list[int] = []
    position = 0
    for spec, names in runs:
        page, count = spec.page_size_bytes, len(names)
        if isinstance(spec, MLASpec) and spec.is_index_group_leader:
            unit_starts.extend(range(position, position + count))
            unit_bytes.extend([page] * count)
        elif unit_bytes:  # non-leaders share the current unit's top-k
            unit_bytes[-1] += page * count
        else:  # no leader yet: the first layers form a unit of their own
            unit_starts.append(position)
            unit_bytes.append(page * count)
        position += count
    pack_starts = [0]  # in units
    filled = 0
    for unit, size in enumerate(unit_bytes):
        if unit > pack_starts[-1] and filled + size > indexer_page:
            pack_starts.append(unit)
            filled = 0
        filled += size
    layer_starts = [unit_starts[unit] for unit in pack_starts] + [position]
    names = [name for run in runs for name in run.names]
    return [
        _pack(runs, names, start, stop)
        for start, stop in pairwise(layer_starts)
    ]


def _pack(runs: list[LayerRun], names: list[str], start: int, stop: int) -> HotPack:
    """Source layers [start, stop), which must share one page size."""
    pages = []
    position = 0
    for spec, run_names in runs:
        if position < stop and position + len(run_names) > start:
            pages.append(spec.page_size_bytes)
        position += len(run_names)
    if len(set(pages)) > 1:
        raise PlanError(
            f"layers: the hot pack {names[start]!r} .. {names[stop - 1]!r} mixes page sizes "
            f"{sorted(set(pages))}; expected one page size per resident/hot group",
            field="layers",
        )
    return HotPack(names[start:stop], pages[0])
