"""HiSparse's tensors beside an SGLang plan's budget (`hisparse.metadata`), proved from the plan's
own figures: request slots and context from req_to_token, layers from the latent pool, the
hot buffer, top-k, host tokens and logical ids from `hisparse`, the draft tokens from
`speculative` (sglang_hisparse_spec.py: the speculative swap's tables). A plan written before the
field lists none; one that lists any lists exactly SGLang 0.5.23's set, each of the shape,
element type and place its figures give, and of those bytes (docs/plan-contract.md)."""

from __future__ import annotations

from typing import Final

from hisparse_plan.checking.sglang_hisparse_spec import (
    check_spec_swap_limits,
    draft_tokens,
    spec_swap_expected,
)
from hisparse_plan.errors import PlanInvariantError
from hisparse_plan.models.sglang_plan import SGLangPlan

SIZE: Final = {"bool": 1, "uint8": 1, "int16": 2, "int32": 4, "int64": 8, "uint64": 8}
MISS_PLAN: Final = frozenset({"_miss_src", "_miss_dst", "_miss_count"})
"""The coordinator's shared-index prefetch plan: present together or not at all."""

Expected = dict[tuple[str, str], tuple[str, str, tuple[int, ...]]]


def _expected(plan: SGLangPlan) -> Expected:
    """(owner, name) -> (location, dtype, shape), the miss plan included."""
    h = plan.hisparse
    if h is None:
        return {}
    rows, width = plan.req_to_token.shape
    page, hot, k = plan.page_size, h.device_buffer_size, h.top_k
    layers = sum(len(t.layers) for t in plan.tensors if t.pool == "kv")
    wide, miss = hot + page, k * max(1, draft_tokens(plan))
    d, c = "device", "coordinator"
    return {
        (c, "req_to_device_buffer"): (d, "int64", (rows, wide)),
        (c, "req_device_buffer_size"): ("host", "int64", (rows,)),
        (c, "req_to_host_pool"): (d, "int64", (rows, width + page)),
        (c, "req_to_host_pool_allocated_len"): ("host", "int64", (rows,)),
        (c, "req_device_buffer_tokens"): (d, "int32", (layers, rows, wide)),
        (c, "req_device_buffer_token_locs"): (d, "int32", (layers, rows, wide)),
        (c, "_lru_init"): (d, "int16", (hot,)),
        (c, "lru_slots"): (d, "int16", (layers, rows, hot)),
        (c, "_device_buffer_arange_i32"): (d, "int32", (hot,)),
        (c, "top_k_device_locs_buffer"): (d, "int32", (rows, k)),
        (c, "raw_indices_buffer"): (d, "int32", (rows, k)),
        (c, "num_real_reqs"): (d, "int32", (1,)),
        (c, "_miss_src"): (d, "int64", (rows, miss)),
        (c, "_miss_dst"): (d, "int32", (rows, miss)),
        (c, "_miss_count"): (d, "int32", (rows,)),
        ("host_pool", "data_ptrs"): (d, "uint64", (layers,)),
        ("host_pool", "free_slots"): ("host", "int64", (h.host_tokens,)),
        ("host_pool", "mem_state"): ("host", "uint8", (h.host_tokens,)),
        ("host_pool", "slot_used"): ("host", "bool", (h.host_tokens,)),
        ("allocator", "full_to_hisparse_device_index_mapping"): (
            d, "int64", (h.logical_tokens + page + 1,)),
        ("allocator.hisparse", "free_pages"): (d, "int64", (plan.max_total_num_tokens // page,)),
        ("allocator.logical", "free_pages"): (d, "int64", (h.logical_tokens // page,)),
        **spec_swap_expected(plan, layers),
    }


def check_hisparse_metadata(plan: SGLangPlan) -> None:
    """Raise PlanInvariantError at the first listed tensor that is not SGLang's, or a missing
    one, in `plan.hisparse.metadata`."""
    h = plan.hisparse
    if h is None or not h.metadata:
        return
    expected = _expected(plan)
    listed = {(b.owner, b.name) for b in h.metadata}
    if len(listed) != len(h.metadata):
        raise PlanInvariantError("hisparse.metadata lists a tensor twice; expected each once")
    miss = {name for owner, name in listed if name in MISS_PLAN}
    if miss and miss != MISS_PLAN:
        raise PlanInvariantError(
            f"hisparse.metadata lists {sorted(miss)} of the shared-index miss plan; expected "
            f"all of {sorted(MISS_PLAN)} or none")
    wanted = {key for key in expected if key[1] not in MISS_PLAN or miss}
    if listed != wanted:
        raise PlanInvariantError(
            f"hisparse.metadata lists {sorted(listed ^ wanted)} against SGLang's set; expected "
            f"the coordinator's, host pool's, allocator's (and with drafts the speculative "
            f"swap's) tensors {sorted(wanted)}")
    for b in h.metadata:
        location, dtype, shape = expected[(b.owner, b.name)]
        got = (b.location, b.dtype, tuple(b.shape))
        if got != (location, dtype, shape):
            raise PlanInvariantError(
                f"hisparse.metadata {b.owner}.{b.name} is {got}; expected "
                f"{(location, dtype, shape)} from the plan's figures")
        size = SIZE[dtype]
        for extent in shape:
            size *= extent
        if b.nbytes != size:
            raise PlanInvariantError(
                f"hisparse.metadata {b.owner}.{b.name} has nbytes {b.nbytes}; expected {size} "
                f"({list(shape)} of {dtype})")
    check_spec_swap_limits(plan)
