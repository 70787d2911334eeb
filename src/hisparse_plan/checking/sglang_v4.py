"""DeepSeek-V4's figures in an SGLang plan, each derived from the plan's own fields another way
than the planner took (docs/plan-contract.md#sglang-plans): the compressed pools' token counts
from the full tokens, the compressor-state rows from the window pages and request slots, every
V4 pool's blocks from those counts, the coefficient from the pools' bytes, the set-aside from
the c128 states, and the budget split from the coefficient; on a pipeline rank, the pools it
keeps empty (a ratio of the model its layers lack) and its own full tokens.

SGLang 0.5.23's DeepSeekV4TokenToKVPool: the window pool holds int(full * ratio) tokens floored
to a page; c4 holds full // 4 slots, c128 full // 128, the c4 index keys 32 slots per c128 slot;
a paged pool of `size` slots has ceil((size + page) / slots_per_page) pages (one model page
reserved); a c4 compressor-state buffer keeps an 8-row ring per window page and a c128 one a
128-row ring per request slot, each plus one ring and one row, rounded up to its ratio.
"""

from __future__ import annotations

import math
from typing import Final

from hisparse_plan.checking.sglang_roles import C4_STATE_RING, C128_STATE_RING, block_bytes
from hisparse_plan.errors import PlanInvariantError
from hisparse_plan.models.pools import Pool
from hisparse_plan.models.sglang_plan import SGLangDeepSeekV4, SGLangPlan

V4_PAGE_TOKENS: Final = 256
"""The one page size of SGLang's paged DeepSeek-V4 pools on CUDA."""
C4_INDEX_SLOTS_PER_C128_SLOT: Final = 32
"""SGLang sizes the c4 index keys as c128 slots * 128 / 4."""
COEFFICIENT_ROUNDING: Final = 1e-12
"""Relative difference allowed between SGLang's float sum of the coefficient and this one."""
_FULL_TOKEN_POOLS: Final = ("v4_c4", "v4_index_c4", "v4_c128")
_WINDOW_TOKEN_POOLS: Final = ("v4_swa", "v4_state_c4", "v4_index_state_c4")


def _round_up(value: int, align: int) -> int:
    return -(-value // align) * align


def _paged(slots: int, slots_per_page: int, page: int) -> int:
    """Pages of a V4 pool of `slots` slots: one model page reserved on top, whole pages."""
    return -(-(slots + page) // slots_per_page)


def _expect(what: str, got: object, want: object, why: str) -> None:
    if got != want:
        raise PlanInvariantError(f"{what} is {got}; expected {want} ({why})")


def check_deepseek_v4(plan: SGLangPlan, pools: dict[str, Pool]) -> None:
    """Every DeepSeek-V4 figure and pool size agrees with the full tokens, the window ratio,
    the page size and the running requests (module doc)."""
    v4 = plan.deepseek_v4
    if v4 is None:
        return
    page, full = plan.page_size, plan.max_total_num_tokens
    _expect("page_size", page, V4_PAGE_TOKENS, "SGLang's paged DeepSeek-V4 pools")
    _expect("deepseek_v4.full_tokens", v4.full_tokens, full, "max_total_num_tokens")
    _expect("max_total_num_tokens modulo page_size", full % page, 0, "whole pages")
    # The planner's own float operation: the plan's ratio gives the same bits here.
    swa = int(full * v4.swa_full_tokens_ratio) // page * page
    _expect("deepseek_v4.swa_tokens", v4.swa_tokens, swa,
            "int(full_tokens * swa_full_tokens_ratio) floored to a page")
    c4, c128 = "v4_c4" in pools, "v4_c128" in pools
    _check_empty_pools(plan, v4, pools)
    # A pipeline rank without a ratio's layers keeps that ratio's pools empty, at full size.
    model_c4, model_c128 = c4 or "v4_c4" in v4.empty_pools, c128 or "v4_c128" in v4.empty_pools
    requests = plan.max_running_requests
    shrink = _c4_shrink(plan)
    derived = {
        "c4_tokens": (full // (4 * shrink) if model_c4 else 0,
                      "full_tokens // 4 with c4 pools, // host_to_device_ratio more with "
                      "HiSparse"),
        "c128_tokens": (full // 128 if model_c128 else 0, "full_tokens // 128 with c128 pools"),
        "c4_index_tokens": (full // 128 * C4_INDEX_SLOTS_PER_C128_SLOT if model_c4 else 0,
                            "32 per c128 slot (full_tokens // 128) with c4 pools"),
        "c4_state_rows": (
            _round_up(swa // page * C4_STATE_RING + C4_STATE_RING + 1, 4) if c4 else 0,
            "8 per window page, plus 9, rounded up to 4"),
        "c128_state_rows": (
            _round_up((requests + 1) * C128_STATE_RING + C128_STATE_RING + 1, 128)
            if c128 else 0,
            "128 per request slot, plus 129, rounded up to 128"),
    }
    for field, (want, why) in derived.items():
        _expect(f"deepseek_v4.{field}", getattr(v4, field), want, why)
    _check_v4_pools(plan, v4, pools)
    _check_v4_budget(plan, v4, pools)
    _check_stage_tokens(plan)
    _check_v4_hisparse(plan, pools)


def _check_empty_pools(plan: SGLangPlan, v4: SGLangDeepSeekV4, pools: dict[str, Pool]) -> None:
    """The pools kept without a buffer: only on a pipeline rank, each once, none the plan also
    holds, the c4 pool and its index keys together (a ratio's pools go as one)."""
    empty = list(v4.empty_pools)
    if not empty:
        return
    if plan.pipeline is None:
        raise PlanInvariantError(
            f"deepseek_v4.empty_pools is {empty}; expected none without pipeline stages (one "
            "rank holds every layer)")
    held = sorted(set(empty) & set(pools))
    if len(set(empty)) != len(empty) or held:
        raise PlanInvariantError(
            f"deepseek_v4.empty_pools is {empty}; expected each pool once and none of the "
            f"plan's own pools (got {held})")
    if ("v4_c4" in empty) != ("v4_index_c4" in empty):
        raise PlanInvariantError(
            f"deepseek_v4.empty_pools is {empty}; expected v4_c4 and v4_index_c4 together "
            "(the ratio-4 layers keep both)")


def _check_stage_tokens(plan: SGLangPlan) -> None:
    """A DeepSeek-V4 pipeline rank's own tokens are the whole pages of full tokens its budget
    holds beside the set-aside: at most what is left over the coefficient, and a page more
    would not fit."""
    v4, pipeline = plan.deepseek_v4, plan.pipeline
    if v4 is None or pipeline is None:
        return
    own, page = pipeline.stage_tokens[pipeline.pp_rank], plan.page_size
    left = plan.budget.available_bytes - v4.fixed_bytes
    coefficient = v4.bytes_per_full_token
    if own % page or own * coefficient > left or (own + page) * coefficient <= left:
        raise PlanInvariantError(
            f"pipeline.stage_tokens[{pipeline.pp_rank}] is {own}; expected the whole pages "
            f"of {page} full tokens that the {left} bytes budget.available_bytes leaves beside "
            f"deepseek_v4.fixed_bytes hold at {coefficient} bytes a full token")


def _c4_shrink(plan: SGLangPlan) -> int:
    """How much smaller HiSparse makes the c4 device pool: its host_to_device_ratio, else 1."""
    return 1 if plan.hisparse is None else plan.hisparse.host_to_device_ratio


def _check_v4_hisparse(plan: SGLangPlan, pools: dict[str, Pool]) -> None:
    """HiSparse on DeepSeek-V4: the allocator hands out full-token ids (logical_tokens is
    max_total_num_tokens); the host pool mirrors every compressed token (full // 4) in
    whole c4 pages of the device pool's page bytes, handing out every page; the hot buffer is
    the device buffer and one c4 page; it holds at least the top-k."""
    hisparse = plan.hisparse
    if hisparse is None:
        return
    if "v4_c4" not in pools or "v4_hisparse_host" not in pools:
        raise PlanInvariantError(
            "hisparse on DeepSeek-V4 without the v4_c4 and v4_hisparse_host pools; expected "
            "both (HiSparse moves the c4 rows)")
    slots = plan.page_size // 4
    host_tokens = -(-(plan.max_total_num_tokens // 4) // slots) * slots
    _expect("hisparse.logical_tokens", hisparse.logical_tokens, plan.max_total_num_tokens,
            "the HiSparse allocator's full-token ids (size_full), max_total_num_tokens")
    _expect("hisparse.host_tokens", hisparse.host_tokens, host_tokens,
            f"the compressed tokens in whole {slots}-slot c4 pages")
    _expect("pool 'v4_hisparse_host' slots", pools["v4_hisparse_host"].num_blocks * slots,
            host_tokens, "hisparse.host_tokens")
    _expect("hisparse.hot_rows_per_request", hisparse.hot_rows_per_request,
            hisparse.device_buffer_size + slots, "device_buffer_size and one c4 page")
    blocks = block_bytes(plan)
    layers = {name: sum(len(t.layers) for t in plan.tensors if t.pool == name)
              for name in ("v4_c4", "v4_hisparse_host")}
    _expect("pool 'v4_hisparse_host' page bytes a layer",
            blocks["v4_hisparse_host"] // max(layers["v4_hisparse_host"], 1),
            blocks["v4_c4"] // max(layers["v4_c4"], 1), "the c4 device pool's page")
    if hisparse.device_buffer_size < hisparse.top_k:
        raise PlanInvariantError(
            f"hisparse.device_buffer_size {hisparse.device_buffer_size} is below top_k "
            f"{hisparse.top_k}")


def _check_v4_pools(plan: SGLangPlan, v4: SGLangDeepSeekV4, pools: dict[str, Pool]) -> None:
    """Each V4 pool's blocks from its figure, and each state buffer's rows its figure."""
    page = plan.page_size
    rings = v4.swa_tokens // page + 1
    blocks = {
        "v4_swa": _paged(v4.swa_tokens, page, page),
        "v4_c4": _paged(v4.c4_tokens, page // 4, page),
        "v4_index_c4": _paged(v4.c4_index_tokens, page // 4, page),
        "v4_c128": _paged(v4.c128_tokens, page // 128, page),
        "v4_state_c4": rings,
        "v4_index_state_c4": rings,
        "v4_state_c128": plan.max_running_requests + 1,
    }
    for name, want in blocks.items():
        if name in pools:
            _expect(f"pool {name!r} num_blocks", pools[name].num_blocks, want,
                    "from the deepseek_v4 figures")
    rows = {"v4_state_c4": v4.c4_state_rows, "v4_index_state_c4": v4.c4_state_rows,
            "v4_state_c128": v4.c128_state_rows}
    for index, tensor in enumerate(plan.tensors):
        want_rows = rows.get(tensor.pool)
        for view in tensor.views if want_rows is not None else ():
            _expect(f"tensors[{index}] view {view.name!r} rows", view.shape[0], want_rows,
                    f"deepseek_v4's state rows for {tensor.pool}")


def _check_v4_budget(plan: SGLangPlan, v4: SGLangDeepSeekV4, pools: dict[str, Pool]) -> None:
    """The coefficient is the budget's cell size; the c128 states set aside before the split
    hold at least the running requests' rings; the full tokens fit what is left."""
    budget = plan.budget
    _expect("deepseek_v4.bytes_per_full_token", v4.bytes_per_full_token,
            budget.cell_size_bytes, "budget.cell_size_bytes: the one coefficient")
    _check_coefficient(plan, v4)
    _check_fixed_bytes(plan, v4, pools)
    left = budget.available_bytes - v4.fixed_bytes
    if left < 0 or plan.max_total_num_tokens * v4.bytes_per_full_token > left:
        raise PlanInvariantError(
            f"max_total_num_tokens {plan.max_total_num_tokens} x bytes_per_full_token "
            f"{v4.bytes_per_full_token} exceeds the {left} bytes budget.available_bytes leaves "
            "beside deepseek_v4.fixed_bytes"
        )


def _check_coefficient(plan: SGLangPlan, v4: SGLangDeepSeekV4) -> None:
    """The coefficient is the bytes one full token takes in the pools: a block of every pool
    serves one page of full tokens (the compressed pools and the c4 index keys), or one page
    of window tokens (the window pool and the c4 compressor states that follow its pages),
    which a full token takes swa_full_tokens_ratio of. SGLang sums it in floats: equal to
    rounding."""
    blocks = block_bytes(plan)
    # HiSparse's c4 device page serves host_to_device_ratio pages of full tokens.
    full = sum(blocks.get(name, 0) / (_c4_shrink(plan) if name == "v4_c4" else 1)
               for name in _FULL_TOKEN_POOLS)
    window = sum(blocks.get(name, 0) for name in _WINDOW_TOKEN_POOLS)
    want = (full + v4.swa_full_tokens_ratio * window) / plan.page_size
    if not math.isclose(v4.bytes_per_full_token, want, rel_tol=COEFFICIENT_ROUNDING):
        raise PlanInvariantError(
            f"deepseek_v4.bytes_per_full_token is {v4.bytes_per_full_token}; the pools give "
            f"{want} ({full} bytes a page of full tokens, {window} a page of window tokens at "
            f"swa_full_tokens_ratio {v4.swa_full_tokens_ratio})"
        )


def _check_fixed_bytes(plan: SGLangPlan, v4: SGLangDeepSeekV4, pools: dict[str, Pool]) -> None:
    """The set-aside is the c128 states SGLang allocates for the requested running requests:
    a 128-row ring a request slot over every c128 layer, (requested + 1) slots and two rings
    more (the 129 extra rows, rounded up to 128). The plan's own states are that for the running
    requests; more requested than run only where the running requests were capped at full //
    2. Without c128 layers it is 0."""
    states = pools.get("v4_state_c128")
    held = 0 if states is None else states.size * sum(
        len(tensor.layers) for tensor in plan.tensors if tensor.pool == states.name)
    rings = v4.c128_state_rows // C128_STATE_RING  # the plan's: running requests + 3
    fixed, running = v4.fixed_bytes, plan.max_running_requests
    if held == 0 or rings == 0 or held % rings:
        _expect("deepseek_v4.fixed_bytes", fixed, held,
                "the c128 compressor states' bytes, 0 without them")
        return
    ring = held // rings
    requested = fixed // ring - 3
    capped = running == plan.max_total_num_tokens // 2
    if fixed % ring or requested < running or (requested > running and not capped):
        raise PlanInvariantError(
            f"deepseek_v4.fixed_bytes is {fixed}; expected the c128 compressor states of the "
            f"requested running requests: (requested + 3) x {ring} bytes (a 128-row ring over "
            f"the c128 layers), {held} for the {running} running requests, more only where "
            f"max_running_requests is capped at max_total_num_tokens // 2 "
            f"({plan.max_total_num_tokens // 2})"
        )
