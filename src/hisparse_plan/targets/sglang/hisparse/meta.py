"""HiSparse's tensors beside the KV budget, as SGLang 0.5.23 allocates them for a DSA model
(report stage). SGLang sizes its KV pools first; the HiSparse coordinator comes after
(`ModelRunner.maybe_init_hisparse_coordinator`), so nothing of these comes out of the budget:

* `HiSparseCoordinator.__init__` (managers/hisparse_coordinator.py): per request slot (R =
  req_to_token's rows) its device buffer's token table and host-pool locations, per layer and
  slot the buffer's tokens, their locations and LRU order, the top-k output and raw-index
  buffers; with a shared index (GLM-5 style), the anchor's miss plan. Two per-slot counters
  live on the host (device="cpu").
* its `MLATokenToKVPoolHost` (mem_cache/pool_host/base.py `clear`, mla.py): a state byte, a
  free-slot id (int64) and a used flag per host token, on the host; a pointer per layer
  (`make_kernel_ptr_table`) on the GPU.
* `HiSparseTokenToKVPoolAllocator` (mem_cache/allocator/hisparse.py): the logical-to-device id
  map (logical ids + a page + 1) and the free-page lists of its two paged allocators (pages 1..n
  of the logical and of the device ids), on the GPU.

* with speculative decoding, its speculative swap's tables (`HiSparseSpecSwapManager`,
  speculative.py), on the GPU; without it they are one empty [layers, R, 0] table, not
  listed.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Final

from hisparse_plan.models.sglang_plan import SGLangHisparse, SGLangHisparseBuffer
from hisparse_plan.targets.sglang.hisparse.speculative import miss_plan_width, spec_swap_rows

ELEMENT_BYTES: Final[dict[str, int]] = {
    "bool": 1, "uint8": 1, "int16": 2, "int32": 4, "int64": 8, "uint64": 8,
}


@dataclass(frozen=True, slots=True)
class HisparseShape:
    """What the coordinator's tensors are sized by."""

    slots: int
    """Request slots: req_to_token's rows (max_running_requests + 1)."""
    context: int
    """req_to_token's width (the request pool's max_context_len)."""
    layers: int
    """Layers of the HiSparse device pool (every latent layer)."""
    page_size: int
    device_tokens: int
    """max_total_num_tokens: the device ids the HiSparse allocator hands out."""
    shared_index: bool
    """Some layer reuses an earlier layer's top-k: the coordinator plans prefetches."""
    draft_tokens: int = 0
    """The draft tokens the coordinator's speculative swap runs (0 without drafts)."""


def _buffer(owner: str, name: str, location: str, dtype: str,
            shape: tuple[int, ...]) -> SGLangHisparseBuffer:
    return SGLangHisparseBuffer.model_validate({
        "owner": owner, "name": name, "location": location, "dtype": dtype,
        "shape": list(shape), "nbytes": prod(shape) * ELEMENT_BYTES[dtype],
    })


def coordinator_buffers(h: SGLangHisparse, s: HisparseShape) -> list[SGLangHisparseBuffer]:
    """HiSparseCoordinator.__init__'s tensors (compress ratio 1 for a DSA pool)."""
    r, padded, buffer = s.slots, h.device_buffer_size + s.page_size, h.device_buffer_size
    rows = [
        ("req_to_device_buffer", "device", "int64", (r, padded)),
        ("req_device_buffer_size", "host", "int64", (r,)),
        ("req_to_host_pool", "device", "int64", (r, s.context + s.page_size)),
        ("req_to_host_pool_allocated_len", "host", "int64", (r,)),
        ("req_device_buffer_tokens", "device", "int32", (s.layers, r, padded)),
        ("req_device_buffer_token_locs", "device", "int32", (s.layers, r, padded)),
        ("_lru_init", "device", "int16", (buffer,)),
        ("lru_slots", "device", "int16", (s.layers, r, buffer)),
        ("_device_buffer_arange_i32", "device", "int32", (buffer,)),
        ("top_k_device_locs_buffer", "device", "int32", (r, h.top_k)),
        ("raw_indices_buffer", "device", "int32", (r, h.top_k)),
        ("num_real_reqs", "device", "int32", (1,)),
    ]
    if s.shared_index:  # _init_shared_index_prefetch: the miss plan, the swap's workspace
        width = miss_plan_width(h.top_k, s.draft_tokens)
        rows += [
            ("_miss_src", "device", "int64", (r, width)),
            ("_miss_dst", "device", "int32", (r, width)),
            ("_miss_count", "device", "int32", (r,)),
        ]
    return [_buffer("coordinator", *row) for row in rows]


def host_pool_buffers(h: SGLangHisparse, s: HisparseShape) -> list[SGLangHisparseBuffer]:
    """The coordinator's MLATokenToKVPoolHost beside its KV buffer: slot tables over its
    host_tokens (dcp 1: the coordinator passes none), a pointer per layer on the GPU."""
    return [
        _buffer("host_pool", "data_ptrs", "device", "uint64", (s.layers,)),
        _buffer("host_pool", "free_slots", "host", "int64", (h.host_tokens,)),
        _buffer("host_pool", "mem_state", "host", "uint8", (h.host_tokens,)),
        _buffer("host_pool", "slot_used", "host", "bool", (h.host_tokens,)),
    ]


def allocator_buffers(h: SGLangHisparse, s: HisparseShape) -> list[SGLangHisparseBuffer]:
    """HiSparseTokenToKVPoolAllocator: the id map (logical + page + a trailing -1) and each
    paged allocator's free pages (1..size // page)."""
    return [
        _buffer("allocator", "full_to_hisparse_device_index_mapping", "device", "int64",
                (h.logical_tokens + s.page_size + 1,)),
        _buffer("allocator.hisparse", "free_pages", "device", "int64",
                (s.device_tokens // s.page_size,)),
        _buffer("allocator.logical", "free_pages", "device", "int64",
                (h.logical_tokens // s.page_size,)),
    ]


def hisparse_metadata(h: SGLangHisparse, s: HisparseShape) -> SGLangHisparse:
    """`h` with every tensor HiSparse allocates beside the budget, by owner and name."""
    spec = [_buffer("spec_swap", *row) for row in spec_swap_rows(
        s.draft_tokens, h.top_k, h.device_buffer_size, s.slots, s.layers)]
    buffers = [*coordinator_buffers(h, s), *host_pool_buffers(h, s), *allocator_buffers(h, s),
               *spec]
    buffers.sort(key=lambda b: (b.owner, b.name))
    return SGLangHisparse.model_validate({**h.model_dump(), "metadata": buffers})


def metadata_bytes(h: SGLangHisparse | None, location: str) -> int:
    """Bytes of HiSparse's tensors beside the budget at `location` (device or host)."""
    if h is None:
        return 0
    return sum(b.nbytes for b in h.metadata if b.location == location)
