"""`check_plan` for an SGLang plan: the pool invariants every version 2 plan keeps, then what
SGLang's pools mean (docs/plan-contract.md#sglang-plans), each number derived from the plan's
own fields another way than the planner took.

Meaning, from the plan alone: every pool is one of SGLang's, in its role (sglang_roles); every
engine view lies in its own pages or its allocation's unowned tail (views); the full pool has one
padding page beside `max_total_num_tokens`; the index keys, the V halves and the Mamba states
have the blocks those figures give; the cell size is the counted pools' bytes a token (a
window pool's at the ratio that gives its tokens: sglang_budget); the
request-to-token table has a padding row beside `max_running_requests`, fits int64 bytes and
its int32 entries hold every token id; HiSparse's and DeepSeek-V4's figures agree with one
another and with the pools (sglang_v4); no figure claims more than the pools hold.
With the request, the plan must be the one the request gives.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from hisparse_plan.checking.agreement import check_answers
from hisparse_plan.checking.pools import check_pool_names, check_ranged_tensors
from hisparse_plan.checking.sglang_budget import check_budget, check_cell_size
from hisparse_plan.checking.sglang_draft import check_draft, request_table_extra
from hisparse_plan.checking.sglang_hisparse_meta import check_hisparse_metadata
from hisparse_plan.checking.sglang_modes import check_modes
from hisparse_plan.checking.sglang_pipeline import (
    check_pipeline,
    check_pipeline_ranks,
    mamba_state_slots,
)
from hisparse_plan.checking.sglang_roles import (
    SGLANG_POOL_ROLES,
    check_layer_sets,
    check_pool_roles,
    check_view_names,
    token_pool,
)
from hisparse_plan.checking.sglang_v4 import check_deepseek_v4
from hisparse_plan.errors import PlanInvariantError
from hisparse_plan.models import PlanRequest
from hisparse_plan.models.base import INT64_MAX
from hisparse_plan.models.pools import Pool
from hisparse_plan.models.sglang_plan import SGLangPlan

REQUEST_TABLE_EXTRA: Final = 4
"""Columns SGLang's request-to-token table keeps beyond the context length."""
INT32_IDS: Final = 2**31
"""Token ids an int32 entry holds (0 to 2**31 - 1)."""
MAMBA_SLOTS_A_REQUEST: Final = 5
"""State slots SGLang keeps per running request of a Mamba hybrid with the radix cache on, what
a plan that does not record budget.mamba_slots_per_request means."""


def check_sglang_plan(
    plan: SGLangPlan, request: PlanRequest | Mapping[str, object] | None
) -> None:
    """Raise `PlanInvariantError` at the first broken invariant of an SGLang plan."""
    check_pipeline_ranks(plan)  # every later rule indexes the stage lists by pp_rank
    pools = check_pool_names(plan.pools, plan.tensors)
    check_pool_roles(plan, pools)
    check_view_names(plan, pools)
    for index, tensor in enumerate(plan.tensors):
        if tensor.ranges is None:
            raise PlanInvariantError(
                f"tensors[{index}] has no page ranges; expected explicit ranges in an SGLang "
                "plan", tensor=index, layer=tensor.layers[0],
            )
    check_ranged_tensors(pools, plan.tensors)
    check_layer_sets(plan, pools)
    check_draft(plan, pools)
    _check_padding(plan, pools)
    _check_request_table(plan)
    _check_hisparse(plan, pools)
    check_hisparse_metadata(plan)
    _check_token_pools(plan, pools)
    check_cell_size(plan, pools)
    _check_index_placeholders(plan)
    check_modes(plan, pools)
    check_deepseek_v4(plan, pools)
    check_pipeline(plan)
    _check_figures(plan, pools)
    if request is not None:
        check_answers(plan, request)


def _check_padding(plan: SGLangPlan, pools: dict[str, Pool]) -> None:
    """Every pool keeps one padding block (SGLang's page 0 or slot 0), and the full pool's
    other pages hold exactly max_total_num_tokens."""
    for pool in plan.pools:
        want = SGLANG_POOL_ROLES[pool.name].padding_blocks  # a known pool (check_pool_roles)
        if pool.padding_blocks != want:
            raise PlanInvariantError(
                f"pool {pool.name!r} has {pool.padding_blocks} padding blocks; expected {want} "
                "(SGLang's padding page or slot 0, none in a DeepSeek-V4 host pool)"
            )
    if plan.deepseek_v4 is not None:
        return  # its full tokens are a figure of their own (sglang_v4)
    name = token_pool(plan, pools)  # present (sglang_roles)
    if name is None:
        return  # a Mamba-only pipeline rank: no pool holds tokens
    tokens = (pools[name].num_blocks - 1) * plan.page_size
    if tokens != plan.max_total_num_tokens:
        raise PlanInvariantError(
            f"pool {name!r} holds {tokens} tokens beside its padding page; expected "
            f"max_total_num_tokens {plan.max_total_num_tokens}"
        )


def _check_request_table(plan: SGLangPlan) -> None:
    """int32 [max_running_requests + 1, context + 4], contiguous from 0, its bytes within
    int64, every token id it may hold within int32."""
    table = plan.req_to_token
    rows = plan.max_running_requests + 1
    if table.dtype != "int32" or len(table.shape) != 2 or table.shape[0] != rows:
        raise PlanInvariantError(
            f"req_to_token is {table.dtype} {table.shape}; expected int32 with {rows} rows "
            "(max_running_requests and the padding row)"
        )
    if list(table.strides) != [table.shape[1], 1] or table.storage_offset != 0:
        raise PlanInvariantError(
            f"req_to_token has strides {table.strides} from {table.storage_offset}; expected a "
            f"contiguous table, strides [{table.shape[1]}, 1] from 0"
        )
    extra = request_table_extra(plan)
    if table.shape[1] <= extra:
        raise PlanInvariantError(
            f"req_to_token is {table.shape[1]} wide; expected a context of at least one token "
            f"and SGLang's {extra} extra columns"
        )
    if table.end_byte > INT64_MAX:
        raise PlanInvariantError(
            f"req_to_token ends at byte {table.end_byte}; expected at most {INT64_MAX} (int64)"
        )
    ids = token_ids(plan)
    if ids > INT32_IDS:
        raise PlanInvariantError(
            f"req_to_token's int32 entries hold token ids below {INT32_IDS}; the plan hands out "
            f"{ids} (padding page included)"
        )


def token_ids(plan: SGLangPlan) -> int:
    """Token ids the request-to-token table may hold: the full pool's with its padding page, or
    HiSparse's host tokens (its logical ids with a padding page)."""
    if plan.hisparse is not None and plan.deepseek_v4 is None:
        return plan.hisparse.host_tokens
    return (plan.max_total_num_tokens + plan.page_size) * plan.budget.dcp_size


def _check_hisparse(plan: SGLangPlan, pools: dict[str, Pool]) -> None:
    """The host pool holds every logical token and a padding page; the hot rows are the device
    buffer and a page."""
    hisparse = plan.hisparse
    if hisparse is None or plan.deepseek_v4 is not None:  # DeepSeek-V4's: sglang_v4
        return
    page = plan.page_size
    logical = plan.max_total_num_tokens * hisparse.host_to_device_ratio
    hot = hisparse.device_buffer_size + page
    if (hisparse.logical_tokens, hisparse.hot_rows_per_request) != (logical, hot):
        raise PlanInvariantError(
            f"hisparse has logical_tokens {hisparse.logical_tokens} and hot_rows_per_request "
            f"{hisparse.hot_rows_per_request}; expected {logical} (max_total_num_tokens x "
            f"host_to_device_ratio) and {hot} (device_buffer_size + page)"
        )
    host = pools["hisparse_host"]  # present exactly with hisparse (sglang_roles)
    host_tokens = (logical // page + 1) * page
    if (hisparse.host_tokens, host.num_blocks * page) != (host_tokens, host_tokens):
        raise PlanInvariantError(
            f"hisparse.host_tokens is {hisparse.host_tokens} and the hisparse_host pool holds "
            f"{host.num_blocks * page} tokens; expected {host_tokens} for both (the "
            f"{logical} logical tokens in whole pages, and a padding page)"
        )
    if hisparse.device_buffer_size < hisparse.top_k:
        raise PlanInvariantError(
            f"hisparse.device_buffer_size {hisparse.device_buffer_size} is below top_k "
            f"{hisparse.top_k}"
        )


def _check_token_pools(plan: SGLangPlan, pools: dict[str, Pool]) -> None:
    """The pools beside the full one have the blocks their figures give: a V half as many as
    its K half, the index keys (index tokens + page + 1) // page pages of the full (or, with
    HiSparse, logical) tokens, both Mamba states as many slots, five a running request."""
    for values, keys in (("kv_v", "kv"), ("swa_v", "swa"), ("mamba_temporal", "mamba_conv0")):
        if values in pools and pools[values].num_blocks != pools[keys].num_blocks:
            raise PlanInvariantError(
                f"pool {values!r} has {pools[values].num_blocks} blocks; expected pool "
                f"{keys!r}'s {pools[keys].num_blocks} (SGLang sizes them alike)"
            )
    page = plan.page_size
    if plan.budget.dcp_size > 1 and ("index" not in pools or plan.hisparse is not None):
        raise PlanInvariantError(
            f"budget.dcp_size is {plan.budget.dcp_size}; SGLang's decode context parallelism "
            "is planned for DSA models (an index pool) without HiSparse; expected 1"
        )
    if "index" in pools:
        dcp = plan.budget.dcp_size
        # Under decode context parallelism, every rank's ids and pages, less the padding page.
        tokens = ((plan.max_total_num_tokens + page) * dcp - page if plan.hisparse is None
                  else plan.hisparse.logical_tokens)
        pages = (tokens + page + 1) // page
        if pools["index"].num_blocks != pages:
            raise PlanInvariantError(
                f"pool 'index' has {pools['index'].num_blocks} pages; expected {pages} for its "
                f"{tokens} tokens ((tokens + page + 1) // page)"
            )
    slots = mamba_state_slots(plan, pools)
    per_request = plan.budget.mamba_slots_per_request or MAMBA_SLOTS_A_REQUEST
    if slots is None and plan.budget.mamba_slots_per_request is not None:
        raise PlanInvariantError(
            f"budget.mamba_slots_per_request is {plan.budget.mamba_slots_per_request}; "
            "expected null without Mamba state pools"
        )
    if slots is not None and plan.max_running_requests * per_request > slots:
        raise PlanInvariantError(
            f"max_running_requests {plan.max_running_requests} needs "
            f"{plan.max_running_requests * per_request} Mamba state slots "
            f"({per_request} a request); the pools hold {slots} beside the padding slot"
        )


def _check_index_placeholders(plan: SGLangPlan) -> None:
    """Zero-row index buffers (layers sharing an earlier layer's index) stand for latent
    layers without index keys of their own: each a layer of the latent pool, none an index
    layer, and with the index layers one per latent layer; only beside an index pool and never
    with HiSparse (whose pool indexes every layer)."""
    placeholders = plan.index_placeholder_layers
    if not placeholders:
        return
    latent = {layer for t in plan.tensors if t.pool == "kv" for layer in t.layers}
    index = [layer for t in plan.tensors if t.pool == "index" for layer in t.layers]
    if not index or plan.hisparse is not None:
        raise PlanInvariantError(
            "index_placeholder_layers given without an index pool, or with HiSparse; expected "
            "none there")
    stray = [layer for layer in placeholders if layer not in latent]
    if stray or len(set(placeholders)) != len(placeholders):
        raise PlanInvariantError(
            f"index_placeholder_layers: expected distinct layers of the latent pool 'kv', got "
            f"{(stray or placeholders)[0]!r}", layer=(stray or placeholders)[0])
    if len(index) + len(placeholders) != len(latent):
        raise PlanInvariantError(
            f"pool 'index' has {len(index)} layers and {len(placeholders)} placeholders; "
            f"expected one of either per latent layer ({len(latent)})")


def _check_figures(plan: SGLangPlan, pools: dict[str, Pool]) -> None:
    """No figure claims more than the pools hold: the budget covers the tokens, a request
    slot has two tokens; the capacity is what the pools hold (at most that beside a window pool,
    whose window the plan does not state)."""
    check_budget(plan, pools)
    if plan.max_running_requests > plan.max_total_num_tokens // 2:
        raise PlanInvariantError(
            f"max_running_requests {plan.max_running_requests} exceeds max_total_num_tokens "
            f"// 2 = {plan.max_total_num_tokens // 2} (SGLang's cap)"
        )
    windowed = "swa" in pools or plan.deepseek_v4 is not None
    _check_capacity("max_concurrency", plan.capacity.max_concurrency,
                    concurrency_bounds(plan, pools), exact=not windowed)
    steady = plan.capacity.steady_state_concurrency
    if (steady is None) != (plan.hisparse is None):
        raise PlanInvariantError(
            f"capacity.steady_state_concurrency is {steady}; expected a figure exactly with "
            "HiSparse"
        )
    if steady is not None and plan.hisparse is not None:
        bounds = concurrency_bounds(plan, pools)
        v4 = plan.deepseek_v4
        hot = {"the full pool's hot buffers":
               plan.max_total_num_tokens / plan.hisparse.hot_rows_per_request} if v4 is None \
            else {"the c4 pool's hot buffers": v4.c4_tokens / plan.hisparse.hot_rows_per_request}
        _check_capacity("steady_state_concurrency", steady, {
            what: bounds[what] for what in ("max_running_requests", "hisparse.logical_tokens")
        } | hot, exact=True)


def concurrency_bounds(plan: SGLangPlan, pools: dict[str, Pool]) -> dict[str, float]:
    """Requests of the request table's context each counted pool holds at once: a request
    takes its context in whole pages of the full pool (and of HiSparse's logical tokens), one
    Mamba slot, one request slot."""
    context = plan.req_to_token.shape[1] - request_table_extra(plan)
    need = -(-context // plan.page_size) * plan.page_size
    bounds = {"max_running_requests": float(plan.max_running_requests),
              "max_total_num_tokens": plan.max_total_num_tokens * plan.budget.dcp_size / need}
    slots = mamba_state_slots(plan, pools)
    if slots is not None:
        bounds["the Mamba state slots"] = float(slots)
    if plan.hisparse is not None:
        bounds["hisparse.logical_tokens"] = plan.hisparse.logical_tokens / need
    return bounds


def _check_capacity(what: str, got: float, bounds: dict[str, float], *, exact: bool) -> None:
    """`got` at most every bound, and the least of them when `exact`."""
    for name, bound in bounds.items():
        if got > bound:
            raise PlanInvariantError(
                f"capacity.{what} {got} exceeds the {bound} requests of the request table's "
                f"context that {name} holds"
            )
    least = min(bounds.values())
    if exact and got != least:
        raise PlanInvariantError(
            f"capacity.{what} is {got}; expected {least}, the fewest requests of the request "
            "table's context any of the pools holds"
        )
