"""How many context_length requests SGLang's pools hold at once."""

from __future__ import annotations

from dataclasses import dataclass

from hisparse_plan.models.plan import Capacity


@dataclass(frozen=True)
class PoolTokens:
    """What the pools hand out, in tokens (or slots), padding excluded."""

    page_size: int
    context_length: int
    max_running_requests: int
    full: int
    """Token ids of the full (or latent) pool: max_total_num_tokens (x dcp_size under decode
    context parallelism, each rank storing every dcp_size-th token of a request)."""
    swa: int | None = None
    window: int | None = None
    mamba_slots: int | None = None
    logical: int | None = None
    """HiSparse: token ids the allocator hands out (the host pool's tokens)."""
    hot_rows: int | None = None
    """HiSparse: device rows one request's hot buffer takes."""


def _pages(tokens: int, page_size: int) -> int:
    return -(-tokens // page_size)


def sglang_capacity(t: PoolTokens) -> Capacity:
    """max_concurrency: the fewest requests of context_length tokens any pool holds at once,
    and never more than max_running_requests. A request takes ceil(context / page) pages of
    the full pool; of the window pool, ceil(min(context, window) / page) pages plus the page
    SGLang's admission keeps free beyond the window; of Mamba states one slot; with HiSparse its
    whole context on the GPU (prefill writes it there) and in the logical (host) space.
    steady_state_concurrency (HiSparse only): the same once each request keeps only its hot
    buffer (device_buffer_size + page rows) on the GPU and every token on the host."""
    need_full = _pages(t.context_length, t.page_size) * t.page_size
    bounds: list[float] = [t.full / need_full, float(t.max_running_requests)]
    if t.swa is not None and t.window is not None:
        window_pages = _pages(min(t.context_length, t.window), t.page_size) + 1
        bounds.append(t.swa / (window_pages * t.page_size))
    if t.mamba_slots is not None:
        bounds.append(float(t.mamba_slots))
    if t.logical is None or t.hot_rows is None:
        return Capacity(max_concurrency=min(bounds), steady_state_concurrency=None)
    host = t.logical / need_full
    steady = min(host, t.full / t.hot_rows, float(t.max_running_requests))
    return Capacity(
        max_concurrency=min([*bounds, host]), steady_state_concurrency=steady
    )
