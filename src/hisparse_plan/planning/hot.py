"""The hot buffer, and the units and packs that become resident and hot groups (SPEC 5.4, 5.5)."""

from __future__ import annotations

from hisparse_plan.errors import PlanError
from hisparse_plan.models import HisparseConfig, MLASpec, ModelConfig

MAX_HOT_ROWS = 32768
"""Hot slot indices are int16."""

Layer = tuple[str, MLASpec]


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


def hot_packs(source: list[Layer], indexer_page: int, one_page: bool) -> list[list[Layer]]:
    """Resident/hot packs: index-sharing units packed greedily, in order, into indexer blocks.

    A unit is a leader and the non-leaders after it (they share one indexer's top-k); a pack
    grows while its pages fit one block of the indexer group. Units are never split, so a unit
    larger than an indexer block gets a pack of its own. `one_page` says all source pages are
    equal, which spares the check that each pack has a single page size.
    """
    packs: list[list[Layer]] = []
    pack: list[Layer] = []
    pack_bytes = 0
    unit: list[Layer] = []
    unit_bytes = 0
    for layer in source:
        if unit and layer[1].is_index_group_leader:
            if pack and pack_bytes + unit_bytes > indexer_page:
                packs.append(pack)
                pack, pack_bytes = [], 0
            pack += unit
            pack_bytes += unit_bytes
            unit, unit_bytes = [], 0
        unit.append(layer)
        unit_bytes += layer[1].page_size_bytes
    if pack and pack_bytes + unit_bytes > indexer_page:
        packs.append(pack)
        pack = []
    packs.append(pack + unit)
    if one_page:  # every source layer has the same page: no pack can mix
        return packs
    for pack in packs:
        page = pack[0][1].page_size_bytes
        if any(spec.page_size_bytes != page for _, spec in pack):
            pages = sorted({spec.page_size_bytes for _, spec in pack})
            raise PlanError(
                f"layers: the hot pack {pack[0][0]!r} .. {pack[-1][0]!r} mixes page sizes "
                f"{pages}; expected one page size per resident/hot group",
                field="layers",
            )
    return packs
