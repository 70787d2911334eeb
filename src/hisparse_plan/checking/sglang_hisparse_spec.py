"""HiSparse's speculative swap in an SGLang plan, proved from the plan's own figures: with
`speculative`, the coordinator runs `speculative.num_draft_tokens` (N) draft tokens, its
`spec_swap` tables are listed and its shared-index miss plan is N x top_k wide; and the plan
keeps within what SGLang 0.5.23 starts with (N in 2..4, top_k >= 1024, N x top_k <= 8192,
request slots within the hot buffer, scratch and padded buffer in whole pages;
docs/plan-contract.md, docs/planning-rules.md#sglang-speculative-decoding)."""

from __future__ import annotations

from hisparse_plan.errors import PlanInvariantError
from hisparse_plan.models.sglang_plan import SGLangPlan

Expected = dict[tuple[str, str], tuple[str, str, tuple[int, ...]]]


def draft_tokens(plan: SGLangPlan) -> int:
    """The draft tokens HiSparse's coordinator is handed: 0 without speculative decoding."""
    return 0 if plan.speculative is None else plan.speculative.num_draft_tokens


def _scratch(n: int, k: int, hot: int) -> int:
    if n == 0:
        return 0
    return min(n * k, max(1024, n * k - hot))


def spec_swap_expected(plan: SGLangPlan, layers: int) -> Expected:
    """(owner, name) -> (location, dtype, shape) of the swap's tables; none without drafts."""
    h, n = plan.hisparse, draft_tokens(plan)
    if h is None or n == 0:
        return {}
    rows = plan.req_to_token.shape[0]
    hot, k = h.device_buffer_size, h.top_k
    buckets = 2
    while buckets < 2 * hot:
        buckets *= 2
    d, s = "device", "spec_swap"
    return {
        (s, "_cache_index"): (d, "int64", (layers, rows, 2, buckets)),
        (s, "_cache_policy"): (d, "int32", (layers, rows + 1, hot)),
        (s, "_hash_entries"): (d, "int64", (hot,)),
        (s, "_hash_slots"): (d, "int64", (hot,)),
        (s, "_scratch_state"): (d, "int32", (rows + 1, max(4 * rows, 5 * n * k))),
        (s, "req_to_scratch"): (d, "int32", (layers, rows, _scratch(n, k, hot))),
        (s, "top_k_device_locs"): (d, "int32", (rows, n, k)),
    }


def check_spec_swap_limits(plan: SGLangPlan) -> None:
    """Raise PlanInvariantError where SGLang's coordinator would refuse to start."""
    h, n = plan.hisparse, draft_tokens(plan)
    if h is None or not h.metadata:
        return
    rows, page, hot, k = plan.req_to_token.shape[0], plan.page_size, h.device_buffer_size, h.top_k
    broken = []
    if n and not (2 <= n <= 4 and k >= 1024):
        broken.append(f"{n} draft tokens with top_k {k} (expected 2..4 and top_k >= 1024)")
    if n and n * k > 8192:
        broken.append(f"{n} x top_k {k} = {n * k} rows a step (expected at most 8192)")
    if n and rows > hot:
        broken.append(f"{rows} request slots (expected at most device_buffer_size {hot})")
    scratch = _scratch(n, k, hot)
    if scratch % page or (hot + page) % page:
        broken.append(f"scratch {scratch} and hot buffer {hot} + {page} (expected multiples "
                      f"of page_size {page})")
    if broken:
        raise PlanInvariantError(
            f"hisparse: SGLang's HiSparse coordinator refuses to start with {broken[0]} "
            "(see docs/planning-rules.md#sglang-speculative-decoding)")
