"""plan_sglang for DeepSeek-V4: the pools SGLang 0.5.23's DeepSeekV4TokenToKVPool allocates on
one rank (paged window pool, c4 / c128 compressed pools, c4 index keys, compressor states)."""

from __future__ import annotations

from hisparse_plan.models.base import built_for
from hisparse_plan.models.request import PlanRequest
from hisparse_plan.models.sglang_plan import SGLangBudget, SGLangDeepSeekV4, SGLangPlan
from hisparse_plan.models.sglang_settings import SGLangSettings
from hisparse_plan.targets.sglang import bounds, sizing, sizing_v4
from hisparse_plan.targets.sglang.capacity import PoolTokens, sglang_capacity
from hisparse_plan.targets.sglang.layout import (
    Placed,
    req_to_token_view,
    v4_index_pool,
    v4_kv_pool,
    v4_state_pool,
)
from hisparse_plan.targets.sglang.model import index_row_bytes
from hisparse_plan.targets.sglang.model_v4 import V4Model, read_v4_model
from hisparse_plan.targets.sglang.sizing_v4 import STATE_RING, V4Sizes

C4_INDEX_SLOTS_PER_C128 = 32
"""SGLang sizes the c4 index keys from the c128 pool: c128 slots * 128 / 4."""


def _place_v4(
    model: V4Model, sizes: V4Sizes, page: int, c128_state_rows: int, requests: int
) -> Placed:
    placed = v4_kv_pool("v4_swa", model.swa, sizes.swa, page, page)
    c4 = model.compressed.get(4)
    if c4:
        slots = page // 4
        placed += v4_kv_pool("v4_c4", c4, sizes.c4, slots, page)
        key_bytes = index_row_bytes(model.index_head_dim)
        index_size = sizes.c128 * C4_INDEX_SLOTS_PER_C128
        placed += v4_index_pool(model.index_keys, index_size, slots, page, key_bytes)
        rows = sizing_v4.state_rows(sizes.c4_state, 4)
        rings = sizes.swa // page + 1
        for name, layers in (("v4_state_c4", model.states[4]),
                             ("v4_index_state_c4", model.index_states)):
            placed += v4_state_pool(name, layers, rows, model.state_widths[name], STATE_RING[4],
                                    rings)
    c128 = model.compressed.get(128)
    if c128:
        placed += v4_kv_pool("v4_c128", c128, sizes.c128, page // 128, page)
        placed += v4_state_pool("v4_state_c128", model.states[128], c128_state_rows,
                                model.state_widths["v4_state_c128"], STATE_RING[128],
                                requests + 1)
    return placed


def plan_deepseek_v4(
    request: PlanRequest, settings: SGLangSettings
) -> SGLangPlan:
    """SGLang's DeepSeek-V4 plan: the budget as for any model, less the c128 state rings of the
    requested running requests, split by the per-full-token coefficient into full tokens; the
    window pool takes swa_full_tokens_ratio of them, c4 a quarter, c128 1/128; the running
    requests are the requested (256 by default) at most full // 2, and the c128 rings are
    allocated for those."""
    sizing_v4.refuse_v4_settings(settings)
    model = read_v4_model(request)
    page = sizing_v4.v4_page_size(settings)
    rest_gb, fraction = sizing.rest_memory_gb(
        settings, request.device.available_bytes, sizing_v4.v4_static_fraction(settings))
    available = sizing.kv_budget_bytes(rest_gb)
    bounds.refuse_budget_past_int64(available, settings)
    ratio = sizing_v4.v4_swa_ratio(settings)
    coefficient = sizing_v4.bytes_per_full_token(model, page, ratio)
    requested = sizing_v4.v4_requested_requests(settings)
    fixed = sizing_v4.c128_state_fixed_bytes(model, requested)
    full = sizing_v4.v4_full_tokens(available, fixed, coefficient, page)
    full = sizing.cap_max_total_tokens(settings, full, page)
    sizes = sizing_v4.v4_sizes(model, full, ratio, page)
    requests = sizing_v4.v4_max_running_requests(requested, sizes.full)
    rows, width = sizing.req_to_token_shape(settings, requests)
    c128_rows = (
        sizing_v4.state_rows(sizing_v4.c128_state_size(requests), 128)
        if model.num_layers(128) else 0
    )
    with built_for(bounds.budget_field(settings), bounds.pools_built(page)):
        placed = _place_v4(model, sizes, page, c128_rows, requests)
    capacity = sglang_capacity(PoolTokens(
        page_size=page, context_length=settings.context_length, max_running_requests=requests,
        full=sizes.full, swa=sizes.swa, window=model.window,
    ))
    return SGLangPlan(
        pools=list(placed.pools),
        tensors=list(placed.tensors),
        page_size=page,
        max_total_num_tokens=sizes.full,
        max_running_requests=requests,
        req_to_token=req_to_token_view(rows, width),
        budget=SGLangBudget(
            available_bytes=available, cell_size_bytes=coefficient,
            mem_fraction_static=fraction,
        ),
        deepseek_v4=SGLangDeepSeekV4(
            full_tokens=sizes.full,
            swa_tokens=sizes.swa,
            swa_full_tokens_ratio=ratio,
            c4_tokens=sizes.c4 if model.num_layers(4) else 0,
            c128_tokens=sizes.c128 if model.num_layers(128) else 0,
            c4_index_tokens=(
                sizes.c128 * C4_INDEX_SLOTS_PER_C128 if model.num_layers(4) else 0
            ),
            c4_state_rows=sizing_v4.state_rows(sizes.c4_state, 4) if model.num_layers(4) else 0,
            c128_state_rows=c128_rows,
            bytes_per_full_token=coefficient,
            fixed_bytes=fixed,
        ),
        capacity=capacity,
    )
