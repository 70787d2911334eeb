"""plan_sglang: a PlanRequest with SGLang settings to the SGLangPlan SGLang 0.5.23 would
allocate on one rank."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from hisparse_plan.errors import PlanError, UnsupportedRequestError
from hisparse_plan.models.base import built_for
from hisparse_plan.models.request import PlanRequest
from hisparse_plan.models.sglang_plan import SGLangBudget, SGLangHisparse, SGLangPlan
from hisparse_plan.models.sglang_settings import SGLangSettings
from hisparse_plan.targets.sglang import bounds, sizing
from hisparse_plan.targets.sglang.capacity import PoolTokens, sglang_capacity
from hisparse_plan.targets.sglang.layout import (
    Placed,
    hisparse_host_pool,
    index_pool,
    latent_pool,
    mamba_pools,
    mha_pool,
    req_to_token_view,
)
from hisparse_plan.targets.sglang.model import SGLangModel, read_model
from hisparse_plan.targets.sglang.model_v4 import is_deepseek_v4
from hisparse_plan.targets.sglang.planner_v4 import plan_deepseek_v4

MAMBA_CONV_DTYPE = "bfloat16"
"""SGLang's conv-state dtype unless its environment says otherwise."""
MAMBA_SSM_DTYPE = "float32"
"""SGLang's temporal-state dtype unless the model config or settings say otherwise."""


def sglang_settings(request: PlanRequest) -> SGLangSettings:
    """The request's SGLang settings; a request without them is a vLLM request. Pipeline
    stages and decode context parallelism are refused (one rank, one stage is planned)."""
    if request.engine is None:
        raise PlanError(
            "engine: expected SGLang settings ({'name': 'sglang', ...}) to plan for SGLang, "
            "got null (a vLLM request)",
            field="engine",
        )
    if request.device.pipeline_stages is not None:
        raise UnsupportedRequestError(
            "device.pipeline_stages: pipeline parallelism is not planned for SGLang yet; "
            "expected null",
            field="device.pipeline_stages",
        )
    dcp = request.scheduler.decode_context_parallel_size
    if dcp != 1:
        raise UnsupportedRequestError(
            "scheduler.decode_context_parallel_size: SGLang's decode context parallelism "
            f"(widened token ids, replicated index keys) is not planned yet; expected 1, got {dcp}",
            field="scheduler.decode_context_parallel_size",
        )
    return request.engine


def refuse_vllm_sections(request: PlanRequest) -> None:
    """vLLM-only sections have no SGLang meaning: HiSparse on SGLang is engine.enable_hisparse
    (its host pool follows host_to_device_ratio, not a GiB budget), and SGLang's tokens are
    capped by engine.max_total_tokens, not a block count. Reading them silently would plan
    something else than asked."""
    if request.hisparse is not None:
        raise UnsupportedRequestError(
            "hisparse: vLLM's HiSparse settings do not apply to SGLang; expected null, and "
            "engine.enable_hisparse with engine.hisparse_* for SGLang's HiSparse",
            field="hisparse",
        )
    if request.device.num_blocks_override is not None:
        raise UnsupportedRequestError(
            "device.num_blocks_override: vLLM's block count does not apply to SGLang; expected "
            "null, and engine.max_total_tokens to cap SGLang's tokens",
            field="device.num_blocks_override",
        )


@dataclass(frozen=True)
class _Sized:
    page_size: int
    rest_gb: float
    fraction: float | None
    mamba_slots: int | None
    available_bytes: int
    cell: sizing.CellSize
    tokens: int
    swa_tokens: int | None


def _latent_row(settings: SGLangSettings, model: SGLangModel) -> tuple[int, int, str]:
    """(row elements, row bytes, kv dtype) of the latent pool; zeros without MLA layers."""
    if model.latent is None:
        return 0, 0, ""
    dtype = sizing.kv_dtype(settings, model.latent.dtype)
    row = sizing.latent_row_elements(settings, model.latent, dtype)
    return row, row * sizing.element_size(sizing.store_dtype(dtype)), dtype


def _size(settings: SGLangSettings, request: PlanRequest, model: SGLangModel) -> _Sized:
    page = sizing.default_page_size(settings, model)
    if model.latent is not None and model.latent.is_dsa:
        sizing.refuse_dsa_page(page)
    fraction = sizing.static_fraction(settings, model)
    rest_gb, fraction = sizing.rest_memory_gb(settings, request.device.available_bytes, fraction)
    slots = None
    if model.mamba is not None:
        slot_bytes = sizing.mamba_slot_bytes(model.mamba, MAMBA_CONV_DTYPE, _ssm_dtype(settings))
        budget = sizing.mamba_budget(settings, rest_gb, slot_bytes)
        slots, rest_gb = budget.slots, budget.rest_gb
    available = sizing.kv_budget_bytes(rest_gb)
    bounds.refuse_budget_past_int64(available, settings)
    ratio = sizing.swa_full_tokens_ratio(settings)
    cell = sizing.cell_size(settings, model, _latent_row(settings, model)[1], ratio)
    tokens = sizing.max_total_num_tokens(available, cell, page)
    tokens = sizing.cap_max_total_tokens(settings, tokens, page)
    sizing.refuse_empty_pool(tokens, page)
    swa = None
    if model.swa is not None and model.swa.window is not None:  # window groups have one
        swa = sizing.swa_tokens(tokens, ratio, page)
        sizing.validate_swa_pool(swa, model.swa.window, page)
    return _Sized(page, rest_gb, fraction, slots, available, cell, tokens, swa)


def _ssm_dtype(settings: SGLangSettings) -> str:
    return MAMBA_SSM_DTYPE if settings.mamba_ssm_dtype is None else settings.mamba_ssm_dtype


def _refuse_hisparse_without_dsa(settings: SGLangSettings, model: SGLangModel) -> None:
    """SGLang's HiSparse pools here are the DSA ones (HiSparseDSATokenToKVPool)."""
    if settings.enable_hisparse and (model.latent is None or not model.latent.is_dsa):
        raise UnsupportedRequestError(
            "engine.enable_hisparse: HiSparse is planned for SGLang's DSA models (mla layers "
            "with indexer layers); expected false for this model, got true",
            field="engine.enable_hisparse",
        )


def _place(
    settings: SGLangSettings, model: SGLangModel, sized: _Sized, hisparse: SGLangHisparse | None
) -> Placed:
    page, tokens = sized.page_size, sized.tokens
    placed = Placed((), ())
    if model.full is not None:
        dtype = sizing.store_dtype(sizing.kv_dtype(settings, model.full.dtype))
        placed += mha_pool("kv", model.full, tokens, page, dtype)
    if model.swa is not None and sized.swa_tokens is not None:
        dtype = sizing.store_dtype(sizing.kv_dtype(settings, model.swa.dtype))
        placed += mha_pool("swa", model.swa, sized.swa_tokens, page, dtype)
    latent = model.latent
    if latent is not None:
        row, _, dtype = _latent_row(settings, model)
        store = sizing.store_dtype(dtype)
        placed += latent_pool(latent.names, tokens, page, row, store)
        if latent.is_dsa:
            index_tokens = tokens if hisparse is None else hisparse.logical_tokens
            placed += index_pool(latent.index_names, index_tokens, page)
        if hisparse is not None:
            placed += hisparse_host_pool(latent.names, hisparse.host_tokens, page, row, store)
    if model.mamba is not None and sized.mamba_slots is not None:
        ssm = _ssm_dtype(settings)
        placed += mamba_pools(model.mamba, sized.mamba_slots, MAMBA_CONV_DTYPE, ssm)
    return placed


def _hisparse(
    settings: SGLangSettings, model: SGLangModel, sized: _Sized
) -> SGLangHisparse | None:
    """HiSparse's figures: device tokens S, logical (host) token ids S * ratio, the pinned host
    pool's tokens, and the hot rows a request keeps on the GPU."""
    if not settings.enable_hisparse or model.latent is None:
        return None
    ratio = settings.hisparse_host_to_device_ratio
    buffer = sizing.hisparse_device_buffer(settings)
    bounds.refuse_hot_rows_past_int64(settings, buffer, sized.page_size)
    host_tokens = sizing.hisparse_host_tokens(sized.tokens, ratio, sized.page_size)
    row_bytes = _latent_row(settings, model)[1]
    bounds.refuse_host_pool_past_int64(host_tokens, row_bytes, len(model.latent.names))
    return SGLangHisparse(
        top_k=settings.hisparse_top_k,
        device_buffer_size=buffer,
        hot_rows_per_request=buffer + sized.page_size,
        host_to_device_ratio=ratio,
        host_tokens=host_tokens,
        logical_tokens=sized.tokens * ratio,
    )


def plan_sglang(request: PlanRequest | Mapping[str, object]) -> SGLangPlan:
    """The pools, tensors and figures SGLang 0.5.23 allocates for `request` on one rank: read
    the layers into SGLang's pools, size the budget and tokens as SGLang does, lay the pools out
    as its classes do, and count how many context_length requests they hold. DeepSeek-V4
    requests take SGLang's own V4 path (planner_v4).

    A mapping is validated first (pydantic's ValidationError for a malformed one). Planning
    raises only PlanError: a setting that would push a figure past what the plan states is
    refused naming the setting (bounds), and a value any model of the plan still refuses is a
    PlanError too, never a ValidationError about a model the caller never wrote."""
    validated = request if isinstance(request, PlanRequest) else PlanRequest.model_validate(
        request)
    with built_for(None, "the SGLang plan"):
        return _plan(validated)


def _plan(request: PlanRequest) -> SGLangPlan:
    settings = sglang_settings(request)
    refuse_vllm_sections(request)
    if is_deepseek_v4(request):
        return plan_deepseek_v4(request, settings)
    model = read_model(request)
    _refuse_hisparse_without_dsa(settings, model)
    if settings.enable_hisparse:
        sizing.hisparse_device_buffer(settings)
    sized = _size(settings, request, model)
    requests = sizing.max_running_requests(settings, sized.tokens, sized.mamba_slots)
    rows, width = sizing.req_to_token_shape(settings, requests)
    hisparse = _hisparse(settings, model, sized)
    with built_for(bounds.budget_field(settings), bounds.pools_built(sized.page_size)):
        placed = _place(settings, model, sized, hisparse)
    capacity = sglang_capacity(PoolTokens(
        page_size=sized.page_size,
        context_length=settings.context_length,
        max_running_requests=requests,
        full=sized.tokens,
        swa=sized.swa_tokens,
        window=None if model.swa is None else model.swa.window,
        mamba_slots=sized.mamba_slots,
        logical=None if hisparse is None else hisparse.logical_tokens,
        hot_rows=None if hisparse is None else hisparse.hot_rows_per_request,
    ))
    return SGLangPlan(
        pools=list(placed.pools),
        tensors=list(placed.tensors),
        page_size=sized.page_size,
        max_total_num_tokens=sized.tokens,
        max_running_requests=requests,
        req_to_token=req_to_token_view(rows, width),
        budget=SGLangBudget(
            available_bytes=sized.available_bytes,
            cell_size_bytes=sized.cell.total,
            mem_fraction_static=sized.fraction,
        ),
        hisparse=hisparse,
        capacity=capacity,
    )
