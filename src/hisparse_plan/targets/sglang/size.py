"""Stage 3, size: the KV budget, what one token costs, the pools' tokens, the running requests
and the request-to-token table, as SGLang computes them (sizing.py; DeepSeek-V4's split of the
budget, deepseek_v4/sizing.py). Hands the next stage `Sized` (or `SizedV4`), with the `Defaults` it
came from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hisparse_plan.models.sglang_plan import SGLangHisparse
from hisparse_plan.targets.sglang import bounds, sizing
from hisparse_plan.targets.sglang.deepseek_v4 import hisparse as hisparse_v4
from hisparse_plan.targets.sglang.deepseek_v4 import sizing as sizing_v4
from hisparse_plan.targets.sglang.deepseek_v4.sizing import V4Sizes
from hisparse_plan.targets.sglang.defaults import CacheDtype, refuse_hot_buffer_below_top_k
from hisparse_plan.targets.sglang.hisparse import speculative as hisparse_spec
from hisparse_plan.targets.sglang.linear_attention_page import mamba_strategy_page
from hisparse_plan.targets.sglang.model import SGLangModel
from hisparse_plan.targets.sglang.modes import (
    dcp,
    pipeline_stages,
    radix,
    speculative,
    window_only,
)
from hisparse_plan.targets.sglang.modes.parallel import attn_dp_size
from hisparse_plan.targets.sglang.modes.speculative_mamba import speculative_mamba_budget
from hisparse_plan.targets.sglang.resolve import Defaults, DefaultsV4
from hisparse_plan.targets.sglang.served.multimodal import mm_reservation_gb
from hisparse_plan.targets.sglang.sizing import CellSize
from hisparse_plan.targets.trace import Trace

STAGE = "size"
RULE = "sglang.budget"


@dataclass(frozen=True, slots=True)
class Sized:
    """The budget and every count the pools are built with."""

    defaults: Defaults
    mem_fraction_static: float | None
    """The fraction SGLang's budget formula ran with (None: the budget was given outright)."""
    available_bytes: int
    cell: CellSize
    tokens: int
    """max_total_num_tokens: the full (or latent) pool's tokens."""
    swa_tokens: int | None
    mamba_slots: int | None
    mamba_slots_per_request: Literal[1, 3, 4, 5] | None
    """State slots a running request may hold (None without Mamba layers)."""
    max_running_requests: int
    req_to_token: tuple[int, int]
    """The request-to-token table's (rows, width)."""
    hisparse: SGLangHisparse | None
    swa_sized_for_requests: bool
    """The window pool sized for the running requests (the radix cache off)."""
    token_ids: int
    """Token ids the allocator hands out: tokens, x dcp_size under decode context
    parallelism (HiSparse's logical tokens are its own figure)."""
    index_tokens: int
    """A DSA model's index-key rows beside HiSparse's: every rank's ids under decode context
    parallelism."""
    draft_cell_bytes: int = 0
    """Bytes the draft worker's layers add to a full token's cell (speculative decoding)."""
    own_tokens: int = 0
    """The full pool's tokens from this rank's own budget, before --max-total-tokens and the
    pipeline ranks' minimum (what a pipeline rank offers the others)."""


@dataclass(frozen=True, slots=True)
class SizedV4:
    """DeepSeek-V4's budget split into its pools' sizes."""

    defaults: DefaultsV4
    mem_fraction_static: float | None
    available_bytes: int
    coefficient: float
    """Bytes per full token (SGLang's float)."""
    fixed_bytes: int
    """The c128 state rings set aside before the split."""
    sizes: V4Sizes
    max_running_requests: int
    req_to_token: tuple[int, int]
    c4_index_tokens: int
    c4_state_rows: int
    c4_state_rings: int
    c128_state_rows: int
    c128_state_rings: int
    hisparse: SGLangHisparse | None = None
    """HiSparse's c4 host pool and hot buffers; None without it."""
    own_tokens: int = 0
    """The full tokens from this rank's own budget and layers, before --max-total-tokens and
    the pipeline ranks' minimum."""


def offered_tokens(defaults: Defaults | DefaultsV4) -> int:
    """What a pipeline rank brings to the ranks' MIN all-reduce: its own tokens, sized alone;
    a rank of Mamba layers only offers int64's largest count (pipeline_stages.zero_cell_tokens),
    which only the minimum makes a pool size, so it is not sized on its own."""
    model = defaults.read.model
    if isinstance(model, SGLangModel) and model.mamba_layers_only:
        return pipeline_stages.zero_cell_tokens(defaults.page_size)
    return size(defaults, Trace()).own_tokens


def size(defaults: Defaults | DefaultsV4, trace: Trace) -> Sized | SizedV4:
    """SGLang's order: the budget (less a Mamba hybrid's states), the bytes per token, the
    tokens (capped, then the window pool's share), the running requests, the table, and
    HiSparse's host and logical tokens."""
    if isinstance(defaults, DefaultsV4):
        return _size_v4(defaults, trace)
    read = defaults.read
    settings, model = read.settings, read.model
    rest_gb, fraction = sizing.rest_memory_gb(
        settings, read.available_bytes, defaults.mem_fraction_static)
    rest_gb -= mm_reservation_gb(settings)
    slots = None
    spec = defaults.speculative
    serving = speculative.speculative_requests(settings, spec)
    strategy_page = mamba_strategy_page(settings, model)
    if model.mamba is not None and defaults.mamba_dtypes is not None:
        slot_bytes = pipeline_stages.stage_slot_bytes(
            sizing.mamba_layer_slot_bytes(model.mamba, *defaults.mamba_dtypes), read.stage,
            len(model.mamba.names))
        budget = (sizing.mamba_budget(settings, rest_gb, slot_bytes) if spec is None else
                  speculative_mamba_budget(serving, rest_gb, slot_bytes, spec, strategy_page))
        slots, rest_gb = budget.slots, budget.rest_gb
    available = sizing.kv_budget_bytes(rest_gb)
    bounds.refuse_budget_past_int64(available, settings)
    row = defaults.latent_row
    row_bytes = 0 if row is None else row.nbytes
    dtypes = (_cache(defaults.full_dtype), _cache(defaults.swa_dtype))
    cell = sizing.cell_size(settings, model, row_bytes, defaults.swa_full_tokens_ratio, dtypes)
    cell, draft_bytes = speculative.with_draft(
        cell, spec, speculative.draft_layer_bytes(model, row_bytes, dtypes)
        * speculative.draft_token_scale(settings),
        speculative.window_layer_bytes(model, dtypes[1]), defaults.swa_full_tokens_ratio)
    own, tokens, swa, for_requests = _pool_tokens(defaults, available, cell)
    bounds.refuse_token_ids_past_int32(tokens + defaults.page_size, bounds.budget_field(settings))
    requests = sizing.max_running_requests(serving, tokens, slots, strategy_page)
    table = sizing.req_to_token_shape(settings, requests, speculative.req_to_token_extra(
        spec, defaults.page_size * settings.dcp_size))
    sized = Sized(
        defaults=defaults, mem_fraction_static=fraction, available_bytes=available, cell=cell,
        tokens=tokens, swa_tokens=swa, mamba_slots=slots, max_running_requests=requests,
        mamba_slots_per_request=None if slots is None else radix.mamba_slots_per_request(
            settings, strategy_page),
        req_to_token=table, hisparse=_hisparse(defaults, tokens),
        swa_sized_for_requests=for_requests,
        token_ids=dcp.token_ids(settings, tokens),
        index_tokens=dcp.index_tokens(settings, tokens, defaults.page_size),
        draft_cell_bytes=draft_bytes,
        own_tokens=own,
    )
    _refuse_hisparse_startup(defaults, table[0])
    if trace.enabled:
        _trace_sized(sized, rest_gb, trace)
    return sized


def _pool_tokens(
    defaults: Defaults, available: int, cell: CellSize
) -> tuple[int, int, int | None, bool]:
    """The rank's own tokens, then the full pool's tokens and the window pool's: the budget
    over the cell size (capped, and the fewest of the pipeline ranks'), the window pool
    swa_full_tokens_ratio of the full one; with the radix cache off and the running requests
    given, the window pool sized for them first and the full pool the rest (true last); a
    pipeline rank of window layers only puts every token in its window pool
    (modes/window_only.py)."""
    read, page = defaults.read, defaults.page_size
    settings, model = read.settings, read.model
    if cell.window_only:
        spec = defaults.speculative
        window_only.refuse_window_only_settings(
            read.stage, page, 0 if spec is None else spec.draft_window_layers)
        own = sizing.max_total_num_tokens(available, cell, page)
        tokens = sizing.cap_max_total_tokens(
            settings, pipeline_stages.agreed_tokens(own, read.stage), page)
        sizing.refuse_empty_pool(tokens, page)
        return own, tokens, tokens, False
    window = None if model.swa is None else model.swa.window  # window groups have one
    serving = speculative.speculative_requests(settings, defaults.speculative)
    cap = (None if window is None else radix.swa_request_cap(
        serving, window, page,
        *speculative.swa_cap_terms(defaults.speculative, page * settings.dcp_size,
                                   overlap=pipeline_stages.overlap_schedule(settings))))
    if cap is not None:
        swa = radix.ceil_page(cap, page)
        own = radix.full_tokens_beside_cap(available, swa, cell.full, cell.swa, page)
        tokens = pipeline_stages.agreed_tokens(own, read.stage)
        capped = sizing.cap_max_total_tokens(settings, tokens, page)
        sizing.refuse_empty_pool(capped, page)
        if capped != own:
            # SGLang's constrained pool keeps the window at its cap, at most the full tokens
            # (max_total_tokens as given: the pool may end mid-page, layout.mha_pool).
            limit = settings.max_total_tokens
            swa = min(swa, tokens if limit is None else min(tokens, limit))
        return own, capped, swa, True
    own = sizing.max_total_num_tokens(available, cell, page)
    tokens = pipeline_stages.agreed_tokens(own, read.stage)
    tokens = sizing.cap_max_total_tokens(settings, tokens, page)
    sizing.refuse_empty_pool(tokens, page)
    if model.swa is None:
        return own, tokens, None, False
    swa = sizing.swa_tokens(tokens, defaults.swa_full_tokens_ratio, page)
    if window is not None:  # a Llama-4 without a chunk size has no admission floor
        sizing.validate_swa_pool(swa, window, page)
    return own, tokens, swa, False


def _cache(dtype: CacheDtype | None) -> str | None:
    return None if dtype is None else dtype.cache


def _refuse_hisparse_startup(defaults: Defaults, slots: int) -> None:
    """What HiSparse refuses after the pools, in SGLang's order: its coordinator when SGLang
    starts (hisparse/speculative.py: the speculative swap's limits, the allocator's whole pages),
    then the first decode step (a hot buffer below the top-k)."""
    buffer, spec = defaults.hisparse_buffer, defaults.speculative
    if buffer is None:
        return
    read = defaults.read
    top_k_field = "engine.hisparse_top_k" if read.index_topk is None else "model.index_topk"
    hisparse_spec.refuse_spec_swap(
        0 if spec is None else spec.num_draft_tokens, defaults.hisparse_top_k, top_k_field,
        buffer, slots, defaults.page_size)
    refuse_hot_buffer_below_top_k(read.settings, buffer, defaults.hisparse_top_k)


def _hisparse(defaults: Defaults, tokens: int) -> SGLangHisparse | None:
    """HiSparse's figures: device tokens S, logical (host) token ids S * ratio, the pinned host
    pool's tokens, and the hot rows a request keeps on the GPU."""
    buffer = defaults.hisparse_buffer
    if buffer is None:
        return None
    settings, page = defaults.read.settings, defaults.page_size
    ratio = settings.hisparse_host_to_device_ratio
    bounds.refuse_hot_rows_past_int64(settings, buffer, page)
    host_tokens = sizing.hisparse_host_tokens(tokens, ratio, page)
    bounds.refuse_token_ids_past_int32(host_tokens, "engine.hisparse_host_to_device_ratio")
    return SGLangHisparse(
        top_k=defaults.hisparse_top_k,
        device_buffer_size=buffer,
        hot_rows_per_request=sizing.hisparse_hot_rows(buffer, page),
        host_to_device_ratio=ratio,
        host_tokens=host_tokens,
        logical_tokens=sizing.hisparse_logical_tokens(tokens, ratio),
    )


def _size_v4(defaults: DefaultsV4, trace: Trace) -> SizedV4:
    """DeepSeek-V4: the budget less the c128 state rings of the requested running requests,
    split by the per-full-token coefficient into full tokens; the window pool takes
    swa_full_tokens_ratio of them, c4 a quarter, c128 1/128; the running requests are the
    requested (256 by default) at most full // 2, and the c128 rings are allocated for
    those."""
    read = defaults.read
    settings, model, page = read.settings, read.model, defaults.page_size
    rest_gb, fraction = sizing.rest_memory_gb(
        settings, read.available_bytes, defaults.mem_fraction_static)
    available = sizing.kv_budget_bytes(rest_gb)
    bounds.refuse_budget_past_int64(available, settings)
    ratio = defaults.swa_full_tokens_ratio
    shrink = hisparse_v4.c4_shrink(settings)
    coefficient = sizing_v4.bytes_per_full_token(model, page, ratio, shrink)
    fixed = sizing_v4.c128_state_fixed_bytes(model, defaults.requested_requests)
    own = sizing_v4.v4_full_tokens(available, fixed, coefficient, page)
    full = pipeline_stages.agreed_tokens(own, read.stage)
    full = sizing.cap_max_total_tokens(settings, full, page)
    bounds.refuse_token_ids_past_int32(full + page, bounds.budget_field(settings))
    sizes = sizing_v4.v4_sizes(model, full, ratio, page, shrink)
    requests = sizing_v4.v4_max_running_requests(defaults.requested_requests, sizes.full)
    table = sizing.req_to_token_shape(settings, requests)
    c4, c128 = model.num_layers(4), model.num_layers(128)
    # A rank without ratio-4 layers still keeps the (empty) c4 index pool of the model's.
    index_tokens = sizing_v4.c4_index_tokens(sizes.c128) if 4 in read.model_ratios else 0
    sized = SizedV4(
        defaults=defaults, mem_fraction_static=fraction, available_bytes=available,
        coefficient=coefficient, fixed_bytes=fixed, sizes=sizes,
        max_running_requests=requests, req_to_token=table,
        c4_index_tokens=index_tokens,
        c4_state_rows=sizing_v4.state_rows(sizes.c4_state, 4) if c4 else 0,
        c4_state_rings=sizing_v4.c4_state_rings(sizes.swa, page),
        c128_state_rows=(
            sizing_v4.state_rows(sizing_v4.c128_state_size(requests), 128) if c128 else 0),
        c128_state_rings=sizing_v4.c128_state_rings(requests),
        hisparse=None if defaults.hisparse_buffer is None else hisparse_v4.v4_hisparse(
            settings, defaults.hisparse_top_k, defaults.hisparse_buffer, sizes.full, page),
        own_tokens=own,
    )
    if trace.enabled:
        _trace_v4(sized, rest_gb, trace)
    return sized


def _trace_budget(
    fraction: float | None, rest_gb: float, available: int, trace: Trace, *, states: bool = False
) -> None:
    source = ("device.available_bytes, given outright" if fraction is None else
              f"free after the weights less (1 - mem_fraction_static {fraction}) of the free "
              "memory before them")
    less = ", less the Mamba states" if states else ""
    trace.add(STAGE, RULE, "budget.available_bytes", available,
              f"int({rest_gb!r} GB x 2**30): {source}{less}, in SGLang's float GB")


def _agreed(stage: pipeline_stages.Stage | None, own_tokens: int) -> str:
    """The words for the pipeline ranks' minimum, when there are ranks."""
    if stage is None or stage.peer_tokens is None:
        return ""
    return (f"; this rank's own {own_tokens}, the fewest of the {stage.size} pipeline "
            f"ranks' {list(stage.peer_tokens)} taken (SGLang's MIN all-reduce)")


def _trace_sized(sized: Sized, rest_gb: float, trace: Trace) -> None:
    defaults = sized.defaults
    page, model = defaults.page_size, defaults.read.model
    if sized.mamba_slots is not None:
        trace.add(STAGE, RULE, "mamba slots", sized.mamba_slots,
                  "max_mamba_cache_size given"
                  if defaults.read.settings.max_mamba_cache_size is not None
                  else "the states' share rest x r / (1 + r) (r = mamba_full_memory_ratio) over "
                  "a slot's bytes, less the padding slot; the slots come off the budget first")
    _trace_budget(sized.mem_fraction_static, rest_gb, sized.available_bytes, trace,
                  states=sized.mamba_slots is not None)
    cell = sized.cell
    draft = ("" if not sized.draft_cell_bytes else
             f" (the draft's {sized.draft_cell_bytes} included)")
    parts = f"full {cell.full}{draft}" + ("" if model.swa is None else (
        f" + window {cell.swa} (a rank of window layers only: no ratio)" if cell.window_only
        else f" + swa_full_tokens_ratio {defaults.swa_full_tokens_ratio} x window {cell.swa}"))
    trace.add(STAGE, RULE, "budget.cell_size_bytes", cell.total,
              f"bytes one token takes in every counted pool, all layers: {parts}")
    capped = ("" if defaults.read.settings.max_total_tokens is None
              else ", capped by max_total_tokens")
    trace.add(STAGE, RULE, "max_total_num_tokens", sized.tokens,
              f"available_bytes {sized.available_bytes} // cell {cell.total}, floored to a page "
              f"of {page}" + capped + _agreed(defaults.read.stage, sized.own_tokens))
    if sized.swa_tokens is not None:
        trace.add(STAGE, RULE, "swa tokens", sized.swa_tokens, (
            "radix cache off: each running request's window + 128 eviction tokens + 2 pages, "
            "two prefill chunks and a page, ceiled to a page; the full pool takes the rest"
        ) if sized.swa_sized_for_requests else (
            "a rank of window layers only: every token of max_total_num_tokens, no full pool"
        ) if cell.window_only else (
            f"int(tokens x swa_full_tokens_ratio {defaults.swa_full_tokens_ratio}), "
            "floored to a page; more than window + page"))
    settings = defaults.read.settings
    given = speculative.speculative_requests(settings, defaults.speculative).max_running_requests
    how = ("given" if settings.max_running_requests is not None
           else "SGLang's default with speculative decoding")
    mamba = ("" if sized.mamba_slots is None
             else f"; at most the Mamba slots // {sized.mamba_slots_per_request}")
    _trace_requests(sized.max_running_requests, sized.req_to_token, (
        f"{given} {how}" + _shared(defaults) if given is not None else
        "SGLang's estimate int(tokens / context_length x 512), clamped to 2048..4096"
    ) + f", at most tokens // 2{mamba}", trace)
    hisparse = sized.hisparse
    if hisparse is not None:
        trace.add(STAGE, RULE, "hisparse.logical_tokens", hisparse.logical_tokens,
                  f"tokens {sized.tokens} x host_to_device_ratio {hisparse.host_to_device_ratio}")
        trace.add(STAGE, RULE, "hisparse.host_tokens", hisparse.host_tokens,
                  f"(logical tokens // page {page} + 1) pages")
        trace.add(STAGE, RULE, "hisparse.hot_rows_per_request", hisparse.hot_rows_per_request,
                  f"device_buffer_size {hisparse.device_buffer_size} + page {page}")


def _shared(defaults: Defaults) -> str:
    groups = attn_dp_size(defaults.read.settings)
    return f" over {groups} attention DP groups (// {groups})" if groups > 1 else ""


def _trace_requests(requests: int, table: tuple[int, int], why: str, trace: Trace) -> None:
    trace.add(STAGE, RULE, "max_running_requests", requests, why)
    trace.add(STAGE, RULE, "req_to_token", f"int32 [{table[0]}, {table[1]}]",
              "[max_running_requests + 1 (row 0 pads), context_length + 4, with speculative "
              "decoding + the draft tokens (at least twice a decode step's allocation and a "
              "page less one)]")


def _trace_v4(sized: SizedV4, rest_gb: float, trace: Trace) -> None:
    _trace_budget(sized.mem_fraction_static, rest_gb, sized.available_bytes, trace)
    defaults = sized.defaults
    trace.add(STAGE, RULE, "budget.cell_size_bytes", sized.coefficient,
              f"bytes per full token: swa_full_tokens_ratio {defaults.swa_full_tokens_ratio} x "
              "a window token (its padded rows and c4 states) + the compressed rows and index "
              "keys one full token adds")
    trace.add(STAGE, RULE, "deepseek_v4.fixed_bytes", sized.fixed_bytes,
              f"the c128 state rings of {defaults.requested_requests} requests, set aside first")
    sizes = sized.sizes
    trace.add(STAGE, RULE, "deepseek_v4.full_tokens", sizes.full,
              f"(available_bytes {sized.available_bytes} - fixed) / coefficient, floored to a "
              f"page of {defaults.page_size}" + _agreed(defaults.read.stage, sized.own_tokens))
    trace.add(STAGE, RULE, "deepseek_v4.swa_tokens", sizes.swa,
              "int(full x swa_full_tokens_ratio), floored to a page")
    _trace_requests(sized.max_running_requests, sized.req_to_token,
                    f"the requested {defaults.requested_requests}, at most full tokens // 2",
                    trace)
