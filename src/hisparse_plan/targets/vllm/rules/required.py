"""Blocks one request holds in a group (SPEC 5.10, 7.7)."""

from __future__ import annotations

from collections.abc import Callable

from hisparse_plan.errors import PlanError
from hisparse_plan.models import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    GroupSpec,
    HisparseHotSpec,
    HisparseResidentSpec,
    MambaSpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
    UniformTypeSpec,
    Workload,
)
from hisparse_plan.rules.arith import ceil_div
from hisparse_plan.targets.vllm.rules.buckets import SpecBucket

ACTIVE_TAIL_PAGES = 2
"""A request already reading from host pins only its last pages of each resident group."""


def required_blocks(spec: GroupSpec, length: int, workload: Workload) -> int:
    """Blocks one request of `length` tokens holds in a group with this spec.

    The block size is the spec's (scaled, SPEC 7.3.2) one; compress_ratio does not enter.
    """
    if isinstance(spec, UniformTypeSpec):
        return max(required_blocks(member, length, workload) for member in spec.specs.values())
    inflight = workload.max_in_flight_tokens
    dcp = workload.decode_context_parallel_size
    if isinstance(spec, SlidingWindowSpec | SlidingWindowMLASpec):
        if spec.dcp_sharded and dcp > 1:
            raise PlanError(
                f"scheduler.decode_context_parallel_size: expected 1 beside a DCP-sharded "
                f"{spec.kind} layer (window {spec.sliding_window}), got {dcp}; decode context "
                "parallelism cannot shard a sliding window (vLLM refuses it too)",
                field="scheduler.decode_context_parallel_size",
            )
        # The window may start mid-block, hence one block more.
        window = spec.sliding_window - 1 + workload.extra_window_tokens + inflight
        return ceil_div(min(window, length), spec.block_size) + 1
    if isinstance(spec, ChunkedLocalAttentionSpec):
        return ceil_div(min(spec.attention_chunk_size + inflight, length), spec.block_size)
    if isinstance(spec, CrossAttentionSpec):
        return cross_attention_blocks(spec, workload)
    if isinstance(spec, MambaSpec):
        return mamba_state_blocks(spec, workload.mamba_cache_mode)
    if isinstance(spec, HisparseResidentSpec):
        return ceil_div(min(inflight, length), spec.block_size)
    if isinstance(spec, HisparseHotSpec):
        return spec.blocks_per_request
    # full_attention (a promoted local layer too) and mla; a DCP rank holds 1/dcp of the tokens
    if spec.dcp_sharded and dcp > 1:
        length = ceil_div(length, dcp)
    return ceil_div(length, spec.block_size)


def cross_attention_blocks(spec: CrossAttentionSpec, workload: Workload) -> int:
    """Blocks a request holds for the encoder's keys and values, whatever its own length
    (vLLM 0.34's `CrossAttentionSpec.max_memory_usage_bytes`): the scheduler's encoder input
    budget, `max_num_encoder_input_tokens`, which vLLM's SchedulerConfig sets to
    max_num_batched_tokens. Decode context parallelism does not divide it (vLLM does not)."""
    return ceil_div(workload.max_num_batched_tokens, spec.block_size)


def mamba_state_blocks(spec: MambaSpec, mamba_cache_mode: str) -> int:
    """State blocks a request holds: the running state and speculative ones; align mode also
    keeps the state of the last full block and the prefill checkpoints."""
    if mamba_cache_mode == "align":
        return 2 + spec.num_speculative_blocks + spec.num_prefill_checkpoint_blocks
    return 1 + spec.num_speculative_blocks


def steady_blocks(spec: GroupSpec, blocks: int) -> int:
    """Of a group's `blocks` per request, those a request keeps once it reads from host."""
    return min(blocks, ACTIVE_TAIL_PAGES) if isinstance(spec, HisparseResidentSpec) else blocks


def buckets_required(buckets: list[SpecBucket], length: int, workload: Workload) -> int:
    """required(group, L): the most blocks any of a group's specs holds."""
    return max(required_blocks(bucket.spec, length, workload) for bucket in buckets)


def longest_fitting(
    bytes_per_block: int, usable: int, blocks: Callable[[int], int], high: int
) -> int:
    """The largest L in [1, high] with bytes_per_block * blocks(L) <= usable; 0 if none.

    blocks(L) is non-decreasing in L, so a bisection finds it (SPEC 5.12, 7.8).
    """
    low = 0
    while low < high:
        middle = (low + high + 1) // 2
        if bytes_per_block * blocks(middle) <= usable:
            low = middle
        else:
            high = middle - 1
    return low
