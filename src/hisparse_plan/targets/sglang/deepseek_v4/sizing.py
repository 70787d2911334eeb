"""SGLang 0.5.23's sizing of DeepSeek-V4's pools (its DSV4PoolConfigurator on CUDA, paged SWA
and FlashMLA V4 page layout), one rule per function.

The token budget is split by a per-full-token byte coefficient that SGLang computes in floats;
these functions do the same float operations in the same order, so the token counts match
SGLang's to the token. The defaults they start from are defaults.py's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from hisparse_plan.errors import CapacityError
from hisparse_plan.targets.sglang.deepseek_v4.model import STATE_DTYPE, V4_ROW_BYTES, V4Model
from hisparse_plan.targets.sglang.model import index_row_bytes
from hisparse_plan.targets.sglang.sizing import element_size

PAGE_ALIGN: Final = 576
"""Bytes a FlashMLA V4 page is padded up to a multiple of."""
STATE_RING: Final = {4: 8, 128: 128}
"""Compressor-state rows one ring keeps (no speculative decoding): 8 for ratio 4 (two
overlapping 4-token windows), 128 for ratio 128."""
STATE_ROWS_ALIGN: Final = {4: 4, 128: 128}
"""A compressor-state buffer's rows are rounded up to a multiple of its ratio."""
C4_INDEX_SLOTS_PER_C128: Final = 32
"""SGLang sizes the c4 index keys from the c128 pool: c128 slots * 128 / 4."""


def v4_page_bytes(slots: int) -> int:
    """Bytes of one V4 page of `slots` 584-byte rows, padded up to a multiple of 576."""
    return -(-slots * V4_ROW_BYTES // PAGE_ALIGN) * PAGE_ALIGN


def paged_bytes_per_slot(page_size: int, ratio: int = 1) -> float:
    """Bytes one stored row costs in a V4 pool with its page padding (float, as SGLang):
    the padded page of page_size / ratio rows over its rows (585.0 at 256, 864.0 at 2)."""
    slots = page_size // ratio
    return v4_page_bytes(slots) / slots


def state_row_bytes(width: int) -> int:
    """Bytes of one compressor-state row of `width` float32 values."""
    return width * element_size(STATE_DTYPE)


def bytes_per_swa_token(model: V4Model, page_size: int) -> float:
    """Bytes one window-pool token costs: its padded row in every decoder layer, plus the c4
    compressor states (attention and indexer) that follow the window pages (8 rows per
    256-token page)."""
    c4_state = 2 * 2 * model.head_dim * element_size(STATE_DTYPE)
    c4_index_state = 2 * 2 * model.index_head_dim * element_size(STATE_DTYPE)
    ring = STATE_RING[4] if model.num_layers(4) else 0
    state_ratio = ring / page_size
    return paged_bytes_per_slot(page_size) * len(model.swa) + (
        state_ratio * (c4_state + c4_index_state) * model.num_layers(4)
    )


def compressed_bytes_per_full_token(
    model: V4Model, ratio: int, page_size: int, c4_shrink: int = 1
) -> float:
    """Bytes one full token adds to one layer of `ratio`: a quarter row (1 / (4 x c4_shrink)
    of one with HiSparse's shrunk c4 pool) and a quarter index key (ratio 4), or 1/128 of a
    row (ratio 128)."""
    if ratio == 4:
        return (
            1 / (4 * c4_shrink) * paged_bytes_per_slot(page_size, 4)
            + 1 / 4 * index_row_bytes(model.index_head_dim)
        )
    return 1 / 128 * paged_bytes_per_slot(page_size, 128)


def bytes_per_full_token(
    model: V4Model, page_size: int, swa_ratio: float, c4_shrink: int = 1
) -> float:
    """SGLang's coefficient: swa_ratio window tokens plus the compressed rows per full token,
    summed over ratios 4 then 128 (7086.75 for DeepSeek-V4-Flash at 0.1)."""
    return swa_ratio * bytes_per_swa_token(model, page_size) + sum(
        compressed_bytes_per_full_token(model, ratio, page_size, c4_shrink) * len(layers)
        for ratio, layers in model.compressed.items()
    )


def state_rows(size: int, ratio: int) -> int:
    """Rows of a compressor-state buffer: `size` ring rows plus one ring and one empty row,
    rounded up to a multiple of the ratio."""
    rows = size + STATE_RING[ratio] + 1
    align = STATE_ROWS_ALIGN[ratio]
    return -(-rows // align) * align


def c128_state_rings(requests: int) -> int:
    """Rings of the c128 compressor states: one per request slot, ring 0 slot 0's."""
    return requests + 1


def c128_state_size(requests: int) -> int:
    """Ring rows of the c128 states: one 128-row ring per request slot (slot 0 pads)."""
    return c128_state_rings(requests) * STATE_RING[128]


def c4_state_size(swa_tokens: int, page_size: int) -> int:
    """Ring rows of the c4 states: one 8-row ring per window page."""
    return swa_tokens // page_size * STATE_RING[4]


def c4_state_rings(swa_tokens: int, page_size: int) -> int:
    """Rings of the c4 compressor states: one per window page, ring 0 the padding page's."""
    return swa_tokens // page_size + 1


def c4_index_tokens(c128_tokens: int) -> int:
    """Slots of the c4 index keys: the c128 pool's slots * 128 / 4."""
    return c128_tokens * C4_INDEX_SLOTS_PER_C128


def c128_state_fixed_bytes(model: V4Model, requests: int) -> int:
    """Bytes SGLang sets aside for the c128 compressor states before the token split, for the
    requested number of running requests."""
    layers = model.num_layers(128)
    if not layers:
        return 0
    rows = state_rows(c128_state_size(requests), 128)
    return rows * state_row_bytes(model.state_widths["v4_state_c128"]) * layers


def v4_full_tokens(
    available_bytes: int, fixed_bytes: int, coefficient: float, page_size: int
) -> int:
    """Full-pool tokens: what is left after the fixed bytes over the coefficient (a float
    division, then int), floored to a page, then lowered page by page while the pages' bytes
    exceed what is left."""
    left = max(available_bytes - fixed_bytes, 0)
    tokens = int(left / coefficient) // page_size * page_size
    while tokens > 0 and tokens * coefficient > left:
        tokens -= page_size
    return tokens


@dataclass(frozen=True)
class V4Sizes:
    """Token counts of SGLang's V4 pools."""

    full: int
    swa: int
    c4: int
    c128: int
    c4_state: int
    """Ring rows of the c4 states (before the buffer's extra rows)."""


def v4_sizes(
    model: V4Model, full: int, swa_ratio: float, page_size: int, c4_shrink: int = 1
) -> V4Sizes:
    """From the full tokens: the window pool int(full * ratio) floored to a page (refused when
    it cannot hold one request: window + page tokens), c4 = full // (4 x c4_shrink), c128 =
    full // 128, and the c4 state rings one per window page."""
    full = full // page_size * page_size
    swa = int(full * swa_ratio) // page_size * page_size
    if model.window + page_size >= swa:
        raise CapacityError(
            f"engine.swa_full_tokens_ratio: SGLang's DeepSeek-V4 window pool cannot hold one "
            f"request; expected more than sliding_window + page_size = "
            f"{model.window + page_size} tokens, got {swa} of {full} full tokens (raise "
            "swa_full_tokens_ratio or the budget)",
            field="engine.swa_full_tokens_ratio",
        )
    c4_state = c4_state_size(swa, page_size) if model.num_layers(4) else 0
    return V4Sizes(full, swa, full // (4 * c4_shrink), full // 128, c4_state)


def v4_max_running_requests(requested: int, full: int) -> int:
    """Running requests: the requested count (256 by default), at most full tokens // 2."""
    requests = min(requested, full // 2)
    if requests <= 0:
        raise CapacityError(
            f"device.available_bytes: SGLang's DeepSeek-V4 pools would run no request; "
            f"expected at least 2 full tokens, got {full}",
            field="device.available_bytes",
        )
    return requests


def v4_pages(size: int, slots_per_page: int, page_size: int) -> int:
    """Pages of a V4 pool of `size` slots: SGLang reserves one model page (page_size tokens,
    counted in slots) on top, then rounds up to whole pages of `slots_per_page`."""
    return -(-(size + page_size) // slots_per_page)
