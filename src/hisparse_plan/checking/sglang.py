"""`check_plan` for an SGLang plan: the pool invariants every version 2 plan keeps, then what
SGLang's pools mean (docs/plan-contract.md#sglang-plans), each number derived from the plan's
own fields another way than the planner took.

Meaning, from the plan alone: every engine view walks exactly the pages the tensor places (its
row stride times a page's tokens is the block stride, its start is a range's start, its layer
axis is the layer stride); the full pool has one padding page beside `max_total_num_tokens`;
the request-to-token table has a padding row beside `max_running_requests`; HiSparse's figures
agree with one another and with the pools; no figure claims more than the pools hold.
With the request, the plan must be the one the request gives.
"""

from __future__ import annotations

from collections.abc import Mapping
from math import prod

from hisparse_plan.checking.agreement import check_answers
from hisparse_plan.checking.pools import check_pool_names, check_ranged_tensors
from hisparse_plan.errors import PlanInvariantError
from hisparse_plan.models import PlanRequest
from hisparse_plan.models.plan import KVCacheTensor
from hisparse_plan.models.pools import BUFFER_DTYPE_SIZE, BufferView, Pool
from hisparse_plan.models.sglang_plan import SGLangPlan

FULL_POOL = "kv"
"""The pool whose tokens are SGLang's max_total_num_tokens."""


def check_sglang_plan(
    plan: SGLangPlan, request: PlanRequest | Mapping[str, object] | None
) -> None:
    """Raise `PlanInvariantError` at the first broken invariant of an SGLang plan."""
    pools = check_pool_names(plan.pools, plan.tensors)
    for index, tensor in enumerate(plan.tensors):
        if tensor.ranges is None:
            raise PlanInvariantError(
                f"tensors[{index}] has no page ranges; expected explicit ranges in an SGLang "
                "plan", tensor=index, layer=tensor.layers[0],
            )
    check_ranged_tensors(pools, plan.tensors)
    for index, tensor in enumerate(plan.tensors):
        _check_views_walk_the_pages(index, tensor, pools[tensor.pool])
    _check_padding(plan)
    _check_request_table(plan)
    _check_hisparse(plan, pools)
    _check_figures(plan)
    if request is not None:
        check_answers(plan, request)


def _check_views_walk_the_pages(index: int, tensor: KVCacheTensor, pool: Pool) -> None:
    """Each view's row of one token (or slot) is a page's share of the block stride, and view
    i starts where range i of block 0 does."""
    ranges = tensor.ranges or []
    layered = pool.allocation == "whole"  # SGLang's whole pools are layer-first
    if tensor.views and len(tensor.views) != len(ranges):
        raise PlanInvariantError(
            f"tensors[{index}] has {len(tensor.views)} views for {len(ranges)} page ranges; "
            "expected one view per range", tensor=index, layer=tensor.layers[0],
        )
    for view, part in zip(tensor.views, ranges, strict=False):
        itemsize = BUFFER_DTYPE_SIZE[view.dtype]
        axes = list(zip(view.shape, view.strides, strict=True))
        if layered:
            layers, layer_step = axes.pop(0)
            _expect(index, tensor, view, "its layer axis (layers, bytes a layer)",
                    (layers, layer_step * itemsize), (len(tensor.layers), tensor.layer_stride))
        if not axes:
            raise PlanInvariantError(
                f"tensors[{index}] view {view.name!r} has no token axis; expected one",
                tensor=index, layer=tensor.layers[0],
            )
        rows, row_step = axes[0]
        tokens = pool.block_tokens or 1
        step = row_step * itemsize
        if step == tensor.block_stride:
            rows_a_page = 1  # page-major: a row a block
        elif step * tokens == tensor.block_stride:
            rows_a_page = tokens  # token-major: a row a token (or slot)
        else:
            raise PlanInvariantError(
                f"tensors[{index}] view {view.name!r} steps {step} bytes a row; the pages it "
                f"views give {tensor.block_stride} a block of {tokens} tokens (a row a block, "
                "or a row a token)", tensor=index, layer=tensor.layers[0],
            )
        # Every block's page in the view; SGLang may keep a few spare rows past the last.
        if rows < pool.num_blocks * rows_a_page:
            raise PlanInvariantError(
                f"tensors[{index}] view {view.name!r} has {rows} rows; the pool's "
                f"{pool.num_blocks} blocks need {pool.num_blocks * rows_a_page}",
                tensor=index, layer=tensor.layers[0],
            )
        row_bytes = prod(n for n, _ in axes[1:]) * itemsize
        _expect(index, tensor, view, "the bytes of a page", row_bytes * rows_a_page, part.size)
        _expect(index, tensor, view, "its first byte", view.storage_offset * itemsize,
                tensor.offset + part.offset)


def _expect(
    index: int, tensor: KVCacheTensor, view: BufferView, what: str, got: object, want: object
) -> None:
    if got != want:
        raise PlanInvariantError(
            f"tensors[{index}] view {view.name!r}: {what} is {got}; the pages it views give "
            f"{want}", tensor=index, layer=tensor.layers[0],
        )


def _check_padding(plan: SGLangPlan) -> None:
    """Every pool keeps one padding block (SGLang's page 0 or slot 0), and the full pool's
    other pages hold exactly max_total_num_tokens."""
    for pool in plan.pools:
        if pool.padding_blocks != 1:
            raise PlanInvariantError(
                f"pool {pool.name!r} has {pool.padding_blocks} padding blocks; expected 1 "
                "(SGLang's padding page or slot 0)"
            )
        # DeepSeek-V4's compressed pools hold page_size / ratio slots a block.
        if plan.deepseek_v4 is None and pool.block_tokens not in (plan.page_size, 1):
            raise PlanInvariantError(
                f"pool {pool.name!r} holds {pool.block_tokens} tokens a block; expected the page "
                f"size {plan.page_size} (or 1 for state slots)"
            )
    full = next((pool for pool in plan.pools if pool.name == FULL_POOL), None)
    if full is not None:
        tokens = (full.num_blocks - 1) * (full.block_tokens or 1)
        if tokens != plan.max_total_num_tokens:
            raise PlanInvariantError(
                f"pool {FULL_POOL!r} holds {tokens} tokens beside its padding page; expected "
                f"max_total_num_tokens {plan.max_total_num_tokens}"
            )


def _check_request_table(plan: SGLangPlan) -> None:
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


def _check_hisparse(plan: SGLangPlan, pools: dict[str, Pool]) -> None:
    """The host pool holds every logical token and a padding page; the hot rows are the device
    buffer and a page."""
    hisparse = plan.hisparse
    if hisparse is None:
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
    host = pools.get("hisparse_host")
    if host is None or host.num_blocks * page != hisparse.host_tokens:
        held = None if host is None else host.num_blocks * page
        raise PlanInvariantError(
            f"the hisparse_host pool holds {held} tokens; expected hisparse.host_tokens "
            f"{hisparse.host_tokens}"
        )
    if hisparse.host_tokens < logical + page:
        raise PlanInvariantError(
            f"hisparse.host_tokens {hisparse.host_tokens} is below the {logical} logical tokens "
            "and a padding page"
        )
    if hisparse.device_buffer_size < hisparse.top_k:
        raise PlanInvariantError(
            f"hisparse.device_buffer_size {hisparse.device_buffer_size} is below top_k "
            f"{hisparse.top_k}"
        )


def _check_figures(plan: SGLangPlan) -> None:
    """No figure claims more than the pools hold."""
    budget = plan.budget
    if plan.max_total_num_tokens * budget.cell_size_bytes > budget.available_bytes:
        raise PlanInvariantError(
            f"max_total_num_tokens {plan.max_total_num_tokens} x cell_size_bytes "
            f"{budget.cell_size_bytes} exceeds budget.available_bytes {budget.available_bytes}"
        )
    if plan.capacity.max_concurrency > plan.max_running_requests:
        raise PlanInvariantError(
            f"capacity.max_concurrency {plan.capacity.max_concurrency} exceeds "
            f"max_running_requests {plan.max_running_requests}"
        )
