"""SGLang 0.5.23's HiSparse on DeepSeek-V4 (`--enable-hisparse`), one rule a function: only the
c4 attention rows move. The GPU keeps a c4 pool shrunk by host_to_device_ratio
(DSV4PoolConfigurator: c4_shrink_factor; a HiSparseC4DevicePool of full // (4 x ratio) slots),
and HiSparseCoordinator mirrors every compressed token in a paged host pool
(DeepSeekV4PagedHostPool `dsv4_hisparse_c4`: one [pages, padded c4 page bytes] buffer a c4
layer, ceil(full // 4 / c4 page) pages, no padding page). The c4 index keys, the window and
c128 pools are as without HiSparse. Rules of the size stage (the figures) and the place stage
(the host pool)."""

from __future__ import annotations

from typing import Final

from hisparse_plan.models.plan import Capacity
from hisparse_plan.models.sglang_plan import SGLangHisparse
from hisparse_plan.models.sglang_settings import SGLangSettings
from hisparse_plan.targets.sglang.deepseek_v4.sizing import v4_page_bytes
from hisparse_plan.targets.sglang.layout import Placed, host_page_pool

C4_RATIO: Final = 4
HOST_POOL: Final = "v4_hisparse_host"


def c4_shrink(settings: SGLangSettings) -> int:
    """How much smaller the c4 device pool is: host_to_device_ratio with HiSparse, else 1."""
    return settings.hisparse_host_to_device_ratio if settings.enable_hisparse else 1


def c4_page_slots(page_size: int) -> int:
    """Compressed slots of one c4 page (the HiSparse device pool's page): page_size // 4."""
    return page_size // C4_RATIO


def host_pages(full_tokens: int, page_size: int) -> int:
    """Pages of the host pool: every compressed token of the full pool (full // 4) in whole
    c4 pages, ceil((full // 4) / (page_size // 4))."""
    slots = c4_page_slots(page_size)
    return -(-(full_tokens // C4_RATIO) // slots)


def v4_hisparse(
    settings: SGLangSettings, top_k: int, device_buffer: int, full_tokens: int, page_size: int
) -> SGLangHisparse:
    """HiSparse's figures on DeepSeek-V4: the top-k and device buffer as on DSA models, a hot
    buffer padded by one c4 page (the coordinator's padded_buffer_size), the host pool's
    tokens (the full pool's compressed tokens, full // 4, in whole c4 pages), and the token
    ids the HiSparse allocator hands out: full-token ids, its size_full, which is
    max_total_num_tokens (logical_tokens; the host pool mirrors a quarter of them)."""
    slots = c4_page_slots(page_size)
    return SGLangHisparse(
        top_k=top_k,
        device_buffer_size=device_buffer,
        hot_rows_per_request=device_buffer + slots,
        host_to_device_ratio=settings.hisparse_host_to_device_ratio,
        host_tokens=host_pages(full_tokens, page_size) * slots,
        logical_tokens=full_tokens,
    )


def v4_host_pool(layers: tuple[str, ...], host_tokens: int, page_size: int) -> Placed:
    """The pinned host pool: every c4 layer one uint8 buffer [pages, padded c4 page bytes],
    layer first, each page the device pool's page as it is laid out on the GPU."""
    slots = c4_page_slots(page_size)
    return host_page_pool(HOST_POOL, layers, host_tokens // slots, slots,
                          v4_page_bytes(slots))


def v4_capacity(
    base: Capacity, hisparse: SGLangHisparse, c4_tokens: int, context_length: int,
    page_size: int, max_running_requests: int,
) -> Capacity:
    """Requests of context_length tokens with HiSparse on DeepSeek-V4: at most what the
    allocator's full-token ids hold (a request's pages of full tokens), beside the pools' own
    bound; steady state, each request keeping only its hot buffer in the shrunk c4 pool."""
    need = -(-context_length // page_size) * page_size
    host = hisparse.logical_tokens / need
    steady = min(host, c4_tokens / hisparse.hot_rows_per_request, float(max_running_requests))
    return Capacity(max_concurrency=min(base.max_concurrency, host),
                    steady_state_concurrency=steady)
