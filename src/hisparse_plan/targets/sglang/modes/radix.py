"""SGLang with its radix cache off (`--disable-radix-cache`, how prefill and decode nodes run):
no prefix is kept beyond a running request, so a Mamba hybrid keeps one state slot a request,
and a window model whose max_running_requests is given sizes its window pool for that many
requests (SGLang's SWARequestCapPoolConfigurator) and gives the rest of the budget to the
full pool. Rules of the size stage (size.py), one function each."""

from __future__ import annotations

from typing import Final, Literal

from hisparse_plan.models.sglang_settings import SGLangSettings
from hisparse_plan.targets.sglang.memory_rule import default_chunked_prefill_size, gpu_memory_mib
from hisparse_plan.targets.sglang.modes.parallel import attn_dp_size, requests_per_worker
from hisparse_plan.targets.sglang.modes.pipeline_stages import overlap_schedule

MAMBA_SLOTS_RADIX_ON: Final[Literal[5]] = 5
"""State slots SGLang keeps per running request with the radix cache on (its default): 3, plus
the 2 tracking slots of the extra_buffer Mamba strategy SGLang picks on CUDA by default (with
the overlap scheduler on)."""
MAMBA_SLOTS_RADIX_OFF: Final[Literal[1]] = 1
MAMBA_SLOTS_NO_OVERLAP: Final[Literal[4]] = 4
"""... and 4 with the overlap scheduler off (pipeline stages): one tracking slot, not two."""
MAMBA_SLOTS_NO_BUFFER: Final[Literal[3]] = 3
"""... and 3 with the no_buffer strategy (no tracking slot;
MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO in kv_cache_configurator)."""
SWA_EVICTION_INTERVAL: Final = 128
"""SGLANG_SWA_EVICTION_INTERVAL's default: decode steps between window evictions."""
CHUNKS_IN_FLIGHT: Final = 2
"""Prefill chunks the overlap scheduler (on by default) keeps in flight."""
UNKNOWN_GPU_CHUNK: Final = 4096
"""SGLang's chunked_prefill_size when it cannot read the GPU's memory."""


def mamba_slots_per_request(
    settings: SGLangSettings, page: int | None
) -> Literal[1, 3, 4, 5]:
    """State slots one running request may hold (KVCacheConfigurator._calculate_mamba_ratio):
    1 without the radix cache; with it 3, plus the extra_buffer strategy's tracking slots
    (mamba_extra_buffer, `page` the one its resolution reads): 2 with the overlap scheduler
    on, 1 without it."""
    if settings.disable_radix_cache:
        return MAMBA_SLOTS_RADIX_OFF
    if not mamba_extra_buffer(settings, page):
        return MAMBA_SLOTS_NO_BUFFER
    return MAMBA_SLOTS_RADIX_ON if overlap_schedule(settings) else MAMBA_SLOTS_NO_OVERLAP


def mamba_extra_buffer(settings: SGLangSettings, page: int | None) -> bool:
    """Whether SGLang's radix cache keeps Mamba states with the extra_buffer strategy
    (overrides._mamba_radix_cache_resolution, strategy auto): when the overlap scheduler is
    wanted (`--disable-overlap-schedule` not given; pipeline stages turn it off only after
    this choice) or `page`, the page the resolution reads (mamba_strategy_page), is above one
    token; else no_buffer. (The hybrid linear models planned all take extra_buffer on the
    triton linear-attention backend.)"""
    return not settings.disable_overlap_schedule or (page is not None and page > 1)


def radix_off_mamba_slots(settings: SGLangSettings) -> int | None:
    """With the radix cache off and max_running_requests given (and no max_mamba_cache_size),
    SGLang keeps exactly one slot per request of one attention DP group; else None (the slots
    come from the memory ratio)."""
    given = settings.max_running_requests
    if not settings.disable_radix_cache or given is None:
        return None
    return requests_per_worker(settings, given)


def resolved_chunked_prefill_size(settings: SGLangSettings) -> int:
    """The prefill chunk SGLang runs with: the given one, else its default for the GPU's
    memory (4096 when the memory is unknown), divided among the attention DP groups."""
    chunk = settings.chunked_prefill_size
    if chunk is None:
        total = settings.gpu_memory_bytes
        chunk = (UNKNOWN_GPU_CHUNK if total is None
                 else default_chunked_prefill_size(gpu_memory_mib(total)))
    return chunk // attn_dp_size(settings)


def swa_request_cap(
    settings: SGLangSettings, window: int, page_size: int,
    draft_tokens: int = 1, decode_allocation: int | None = None,
) -> int | None:
    """The window pool's tokens with the radix cache off and max_running_requests given:
    each request of one DP group holds its window, an eviction interval's tokens (an interval
    a draft token with speculative decoding) and a trailing page, and the next decode's
    allocation (a page; with speculative decoding `decode_allocation`), plus the prefill chunks
    in flight and a page (pool_configurator.compute_swa_request_cap). None: the
    swa_full_tokens_ratio rule applies."""
    given = settings.max_running_requests
    if not settings.disable_radix_cache or given is None:
        return None
    decode = page_size if decode_allocation is None else decode_allocation
    per_request = window + SWA_EVICTION_INTERVAL * draft_tokens + page_size + decode
    chunks = (CHUNKS_IN_FLIGHT if overlap_schedule(settings) else 1) * (
        resolved_chunked_prefill_size(settings))
    return per_request * requests_per_worker(settings, given) + chunks + page_size


def ceil_page(tokens: int, page_size: int) -> int:
    return -(-tokens // page_size) * page_size


def full_tokens_beside_cap(
    available_bytes: int, swa_tokens: int, full_bytes: int, swa_bytes: int, page_size: int
) -> int:
    """The full pool's tokens once the capped window pool (swa_tokens of swa_bytes each) is
    set aside: the rest over a full token's bytes, floored to a page."""
    return (available_bytes - swa_tokens * swa_bytes) // full_bytes // page_size * page_size

