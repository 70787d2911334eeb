"""`check_plan`'s budget rules for an SGLang plan (docs/plan-contract.md#sglang-plans), from
the plan alone: budget.cell_size_bytes is the counted pools' bytes a token (a window pool's at
the ratio that gives its tokens, a window-only pipeline rank's whole, 0 on a Mamba-only rank),
and the budget covers the tokens."""

from __future__ import annotations

import math
from fractions import Fraction

from hisparse_plan.checking.sglang_draft import draft_window_page_bytes
from hisparse_plan.checking.sglang_roles import block_bytes, window_only_rank
from hisparse_plan.errors import PlanInvariantError
from hisparse_plan.models.pools import Pool
from hisparse_plan.models.sglang_plan import SGLangPlan


def check_cell_size(plan: SGLangPlan, pools: dict[str, Pool]) -> None:
    """budget.cell_size_bytes is one token's bytes over the pools SGLang counts: the full pool
    (and its V pool), the index keys (with HiSparse, ratio tokens' worth a device token); a
    window pool adds its ratio of a token (more than nothing, and the ratio that gives its
    tokens: _check_window_ratio); Mamba states and the host pool come off the budget apart.
    DeepSeek-V4's coefficient is its own figure (sglang_v4)."""
    if plan.deepseek_v4 is not None:
        return
    full, window = _page_bytes(plan)
    cell = plan.budget.cell_size_bytes
    if window_only_rank(plan, pools):  # no full pool to weigh the window by: every byte
        if cell * plan.page_size != full + window:
            raise PlanInvariantError(
                f"budget.cell_size_bytes is {cell}; a rank of window layers only counts its "
                f"window pool whole, {(full + window) / plan.page_size} bytes a token")
        return
    # Bytes a page over the page's tokens: a page of every counted layer.
    fits = cell * plan.page_size > full if window else cell * plan.page_size == full
    if not fits:
        raise PlanInvariantError(
            f"budget.cell_size_bytes is {cell}; the counted pools take {full / plan.page_size} "
            f"bytes a token{' before the window pool' if window else ''}"
        )
    if window and not plan.budget.swa_sized_for_requests:
        _check_window_ratio(plan, pools["swa"], Fraction(full, plan.page_size),
                            Fraction(window, plan.page_size))


def _check_window_ratio(
    plan: SGLangPlan, swa: Pool, full: Fraction, window: Fraction
) -> None:
    """The cell size states the window ratio the plan does not: SGLang's cell is full + ratio x
    window bytes a token (a float sum), and its window pool int(max_total_num_tokens x ratio)
    tokens floored to a page. The ratio the cell gives, give or take the sum's rounding (an ulp
    of the cell over the window's bytes, doubled) and the product's (a few ulps), must give the
    window pool's tokens beside its padding page."""
    cell = plan.budget.cell_size_bytes
    ratio = (Fraction(cell) - full) / window
    slack = Fraction(2 * math.ulp(cell)) / window
    rounding = Fraction(1, 2**51)
    page, tokens = plan.page_size, plan.max_total_num_tokens
    low = math.floor(tokens * (ratio - slack) * (1 - rounding)) // page * page
    high = math.floor(tokens * (ratio + slack) * (1 + rounding)) // page * page
    held = (swa.num_blocks - 1) * page
    if not low <= held <= high:
        raise PlanInvariantError(
            f"pool 'swa' holds {held} tokens beside its padding page; budget.cell_size_bytes "
            f"{cell} counts the window pool at {float(ratio)} of a token, which gives "
            f"{low if low == high else f'{low} to {high}'} (int(max_total_num_tokens x ratio) "
            "floored to a page)"
        )


def _page_bytes(plan: SGLangPlan) -> tuple[int, int]:
    """Bytes one page takes over every layer of the counted pools: the full pool (its V pool,
    the index keys: HiSparse's ratio pages of them, or dcp_size pages where decode context
    parallelism replicates the indexer), and the window pool."""
    ratio = plan.budget.dcp_size if plan.hisparse is None else plan.hisparse.host_to_device_ratio
    weights = {"kv": 1, "kv_v": 1, "index": ratio}
    blocks = block_bytes(plan)
    full = sum(blocks.get(name, 0) * weight for name, weight in weights.items())
    if plan.speculative is not None:  # the draft's layers, priced at the target's geometry
        full += plan.speculative.draft_cell_size_bytes * plan.page_size
    window = blocks.get("swa", 0) + blocks.get("swa_v", 0) + draft_window_page_bytes(plan)
    return full, window


def check_budget(plan: SGLangPlan, pools: dict[str, Pool]) -> None:
    """The budget covers the tokens: max_total_num_tokens cells; with a window pool sized for
    the running requests (the radix cache off), which is not swa_full_tokens_ratio of the full
    one, the pools' own bytes."""
    budget = plan.budget
    if budget.swa_sized_for_requests and "swa" not in pools:
        raise PlanInvariantError(
            "budget.swa_sized_for_requests is true; expected false without a window pool"
        )
    if not budget.swa_sized_for_requests:
        if plan.max_total_num_tokens * budget.cell_size_bytes > budget.available_bytes:
            raise PlanInvariantError(
                f"max_total_num_tokens {plan.max_total_num_tokens} x cell_size_bytes "
                f"{budget.cell_size_bytes} exceeds budget.available_bytes "
                f"{budget.available_bytes}"
            )
        return
    full, window = _page_bytes(plan)
    swa_pages = pools["swa"].num_blocks - 1  # the padding page aside
    used = plan.max_total_num_tokens * full // plan.page_size + swa_pages * window
    if used > budget.available_bytes:
        raise PlanInvariantError(
            f"the full pool's {plan.max_total_num_tokens} tokens and the window pool's "
            f"{swa_pages} pages take {used} bytes; budget.available_bytes is "
            f"{budget.available_bytes}"
        )
