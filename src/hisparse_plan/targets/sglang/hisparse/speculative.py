"""HiSparse with speculative decoding, as SGLang 0.5.23 builds it: the coordinator's speculative
swap (`HiSparseSpecSwapManager`, managers/hisparse_coordinator.py) and the checks SGLang runs
when it starts, after the pools (`ModelRunner.maybe_init_hisparse_coordinator` hands the
coordinator the resolved `speculative_num_draft_tokens`, 0 without a speculative algorithm).

With draft tokens the swap keeps, per layer and request slot, a hash index over the hot buffer
(`_cache_index`), an eviction policy row (`_cache_policy`, one row more), a scratch block of
graph-stable rows (`req_to_scratch`), a counter table (`_scratch_state`), a top-k output per
draft token (`top_k_device_locs`), and the hash's slots and entries for one buffer. Its
workspace (draft tokens x top-k rows) also widens the shared-index miss plan. SGLang refuses to
start unless 2..4 draft tokens, top_k >= 1024, a workspace of at most 8192 rows and request
slots within the device buffer; its allocator then takes the scratch and the padded buffer in
whole pages, a check that runs without drafts too (see
docs/planning-rules.md#sglang-speculative-decoding)."""

from __future__ import annotations

from typing import Final

from hisparse_plan.errors import PlanError

DOC: Final = "docs/planning-rules.md#sglang-speculative-decoding"
DRAFT_TOKENS: Final = range(2, 5)
"""Draft tokens the swap kernels take (2..4)."""
MIN_TOP_K: Final = 1024
MAX_WORKSPACE: Final = 8192
"""Top-k rows of one step's draft tokens the swap holds (its 'occurrences')."""
MIN_SCRATCH: Final = 1024
VALUES_PER_OCCURRENCE: Final = 5
COUNTERS_PER_REQUEST: Final = 4

Row = tuple[str, str, str, tuple[int, ...]]
"""(name, location, dtype, shape) of one tensor."""


def miss_plan_width(top_k: int, draft_tokens: int) -> int:
    """The shared-index miss plan's width: the swap's workspace, top_k a draft token
    (`miss_plan_capacity`, top_k x max(1, draft tokens))."""
    return top_k * max(1, draft_tokens)


def scratch_capacity(draft_tokens: int, top_k: int, buffer: int) -> int:
    """Scratch rows a request reserves: the workspace beyond the hot buffer, at least 1024 and
    at most the workspace; none without drafts."""
    if draft_tokens == 0:
        return 0
    workspace = draft_tokens * top_k
    return min(workspace, max(MIN_SCRATCH, workspace - buffer))


def hash_size(buffer: int) -> int:
    """The hash index's width: the power of two at or above 2 x the buffer (at least 2)."""
    return 1 << max(1, (2 * buffer - 1).bit_length())


def spec_swap_rows(draft_tokens: int, top_k: int, buffer: int, slots: int,
                   layers: int) -> list[Row]:
    """The swap's tensors (none without drafts: its one table is then [layers, slots, 0])."""
    if draft_tokens == 0:
        return []
    workspace = draft_tokens * top_k
    width = max(COUNTERS_PER_REQUEST * slots, VALUES_PER_OCCURRENCE * workspace)
    d = "device"
    return [
        ("_cache_index", d, "int64", (layers, slots, 2, hash_size(buffer))),
        ("_cache_policy", d, "int32", (layers, slots + 1, buffer)),
        ("_hash_entries", d, "int64", (buffer,)),
        ("_hash_slots", d, "int64", (buffer,)),
        ("_scratch_state", d, "int32", (slots + 1, width)),
        ("req_to_scratch", d, "int32",
         (layers, slots, scratch_capacity(draft_tokens, top_k, buffer))),
        ("top_k_device_locs", d, "int32", (slots, draft_tokens, top_k)),
    ]


def refuse_draft_tokens_or_top_k(draft_tokens: int, top_k: int, top_k_field: str) -> None:
    """The swap kernels run 2..4 draft tokens and a top-k of at least 1024."""
    if draft_tokens in DRAFT_TOKENS and top_k >= MIN_TOP_K:
        return
    field = ("engine.speculative_num_draft_tokens" if draft_tokens not in DRAFT_TOKENS
             else top_k_field)
    raise PlanError(
        f"{field}: SGLang's HiSparse speculative swap (HiSparseSpecSwapManager) refuses to "
        f"start unless it runs 2..4 draft tokens and top_k >= {MIN_TOP_K}; expected "
        f"speculative_num_draft_tokens in 2..4 and top_k at least {MIN_TOP_K}, got "
        f"{draft_tokens} draft tokens and top_k {top_k} (see {DOC})",
        field=field,
    )


def refuse_workspace(draft_tokens: int, top_k: int) -> None:
    """A step's draft tokens x top-k rows fit the swap's 8192-row workspace."""
    workspace = draft_tokens * top_k
    if workspace > MAX_WORKSPACE:
        raise PlanError(
            f"engine.speculative_num_draft_tokens: SGLang's HiSparse speculative swap holds "
            f"at most {MAX_WORKSPACE} top-k rows a step; expected speculative_num_draft_tokens "
            f"x top_k at most {MAX_WORKSPACE}, got {draft_tokens} x {top_k} = {workspace} "
            f"(see {DOC})",
            field="engine.speculative_num_draft_tokens",
        )


def refuse_request_slots(slots: int, buffer: int) -> None:
    """The swap's request slots (req_to_token's rows) fit in device_buffer_size."""
    if slots > buffer:
        raise PlanError(
            f"engine.max_running_requests: SGLang's HiSparse speculative swap refuses more "
            f"request slots than device_buffer_size; expected at most {buffer} request slots "
            f"(max_running_requests + 1, an attention DP group's), got {slots} (see {DOC})",
            field="engine.max_running_requests",
        )


def refuse_unpaged_swap(scratch: int, buffer: int, page_size: int) -> None:
    """The HiSparse allocator (`configure_spec_scratch`, run with or without drafts) takes the
    scratch rows and the padded hot buffer (device_buffer_size + a page) in whole pages."""
    if scratch % page_size == 0 and (buffer + page_size) % page_size == 0:
        return
    raise PlanError(
        f"engine.hisparse_device_buffer_size: SGLang's HiSparse allocator refuses to start "
        f"unless its speculative scratch ({scratch} rows) and hot buffer (device_buffer_size "
        f"{buffer} + a page) are multiples of page_size {page_size}; expected "
        f"device_buffer_size a multiple of {page_size}, and with drafts a scratch of whole "
        f"pages (see {DOC})",
        field="engine.hisparse_device_buffer_size",
    )


def refuse_spec_swap(draft_tokens: int, top_k: int, top_k_field: str, buffer: int,
                     slots: int, page_size: int) -> None:
    """SGLang's startup checks of the coordinator, in its order: the swap's (with drafts), then
    the allocator's pages."""
    if draft_tokens > 0:
        refuse_draft_tokens_or_top_k(draft_tokens, top_k, top_k_field)
        refuse_workspace(draft_tokens, top_k)
        refuse_request_slots(slots, buffer)
    refuse_unpaged_swap(scratch_capacity(draft_tokens, top_k, buffer), buffer, page_size)
