"""The host pool's numbers (SPEC 5.7)."""

from __future__ import annotations

from hisparse_plan.models.base import GIB
from hisparse_plan.models.layout import KVCacheLayout
from hisparse_plan.rules.arith import ceil_div, round_up

SHARED_POOL_ALIGNMENT = 4096
"""A host pool shared between processes is an mmap: its blocks must start on OS pages."""
SPARE_HOST_BLOCKS = 2
"""The null block and a copy-on-write tail, beyond one max_model_len request."""


def host_budget_bytes(host_pool_gib: float) -> int:
    """int(host_pool_gib * 2**30): float multiply, then truncate (as the engine reads it)."""
    return int(host_pool_gib * GIB)


def host_block_stride(source_page: int, shared: bool) -> int:
    return round_up(source_page, SHARED_POOL_ALIGNMENT) if shared else source_page


def host_blocks_needed(max_model_len: int, block_size: int) -> int:
    """One max_model_len request, the null block and a copy-on-write tail."""
    return ceil_div(max_model_len, block_size) + SPARE_HOST_BLOCKS


def longest_request_held(num_blocks: int, block_size: int) -> int:
    """The longest request a host pool of `num_blocks` holds beside the spare blocks (the bound
    HiSparse's auto-fit and its admission estimate stop at)."""
    return max(num_blocks - SPARE_HOST_BLOCKS, 0) * block_size


def host_pool_layout(requested: str) -> KVCacheLayout:
    """The host tensors' layout. vLLM 0.33/0.34 place the source group LBNHC
    (`vllm.v1.hisparse.layout.get_hisparse_kv_cache_config`: `host_layout =
    KVCacheLayout.LBNHC`); the `block_outermost` option places it BLNHC, so a block holds
    every source layer's page back to back, in the group's order (see
    docs/transfer.md#placement-that-transfers-well)."""
    return KVCacheLayout.BLNHC if requested == "block_outermost" else KVCacheLayout.LBNHC
