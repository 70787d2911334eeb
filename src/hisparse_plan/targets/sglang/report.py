"""Stage 5, report: how many context_length requests the pools hold (capacity.py), and the plan
put together from the finished values of the stages before."""

from __future__ import annotations

import math

from hisparse_plan.models.base import FrozenList
from hisparse_plan.models.plan import Capacity
from hisparse_plan.models.sglang_plan import (
    SGLangBudget,
    SGLangDeepSeekV4,
    SGLangEmptyMambaPool,
    SGLangHisparse,
    SGLangPipeline,
    SGLangPlan,
    SGLangSpeculative,
)
from hisparse_plan.targets.sglang.capacity import PoolTokens, sglang_capacity
from hisparse_plan.targets.sglang.deepseek_v4.hisparse import v4_capacity
from hisparse_plan.targets.sglang.deepseek_v4.pipeline_stages import empty_pools
from hisparse_plan.targets.sglang.hisparse.meta import (
    HisparseShape,
    hisparse_metadata,
    metadata_bytes,
)
from hisparse_plan.targets.sglang.layout import Placed, empty_mamba_pools, req_to_token_view
from hisparse_plan.targets.sglang.modes.draft_budget import (
    beyond_budget_warning,
    draft_beyond_budget,
    refuse_draft_past_device,
    refuse_past_budget,
)
from hisparse_plan.targets.sglang.modes.pipeline_stages import pp_indices
from hisparse_plan.targets.sglang.modes.speculative import draft_token_scale
from hisparse_plan.targets.sglang.size import Sized, SizedV4
from hisparse_plan.targets.trace import Trace

STAGE = "report"
RULE = "sglang.capacity"


def report(sized: Sized | SizedV4, placed: Placed, trace: Trace) -> SGLangPlan:
    if isinstance(sized, SizedV4):
        return _report_v4(sized, placed, trace)
    defaults = sized.defaults
    settings, model, page = defaults.read.settings, defaults.read.model, defaults.page_size
    hisparse = _with_metadata(sized)
    if trace.enabled and hisparse is not None and hisparse.metadata:
        device, host = (metadata_bytes(hisparse, where) for where in ("device", "host"))
        trace.add(STAGE, "sglang.budget", "hisparse.metadata", device,
                  f"HiSparseCoordinator, its host pool and allocator allocate "
                  f"{len(hisparse.metadata)} tensors after the pools, outside the budget: "
                  f"{device} B on the GPU, {host} B on the host")
        _trace_spec_swap(hisparse, sized, trace)
    tokens = PoolTokens(
        page_size=page,
        context_length=settings.context_length,
        max_running_requests=sized.max_running_requests,
        full=sized.token_ids,
        swa=sized.swa_tokens,
        window=None if model.swa is None else model.swa.window,
        mamba_slots=sized.mamba_slots,
        logical=None if hisparse is None else hisparse.logical_tokens,
        hot_rows=None if hisparse is None else hisparse.hot_rows_per_request,
    )
    beyond = draft_beyond_budget(placed, sized.draft_cell_bytes, page,
                                 draft_token_scale(settings))
    refuse_draft_past_device(beyond, sized.available_bytes)
    if not sized.swa_sized_for_requests:
        refuse_past_budget(sized.available_bytes, math.ceil(sized.tokens * sized.cell.total),
                           beyond)
    plan = _plan(
        placed, tokens, trace, sized.tokens, sized.req_to_token,
        budget=SGLangBudget(
            available_bytes=sized.available_bytes,
            cell_size_bytes=sized.cell.total,
            mem_fraction_static=sized.mem_fraction_static,
            mamba_slots_per_request=sized.mamba_slots_per_request,
            dcp_size=settings.dcp_size,
            swa_sized_for_requests=sized.swa_sized_for_requests,
        ),
        hisparse=hisparse,
        index_placeholder_layers=_placeholders(sized),
        speculative=_speculative(sized, beyond),
        pipeline=_pipeline(sized),
    )
    if not beyond:
        return plan
    note = beyond_budget_warning(beyond, sized.available_bytes, sized.draft_cell_bytes)
    trace.add(STAGE, "sglang.speculative", "speculative.draft_beyond_budget_bytes", beyond, note)
    return plan.model_copy(update={"warnings": FrozenList([*plan.warnings, note])})


def _pipeline(sized: Sized | SizedV4) -> SGLangPipeline | None:
    """The rank's stage and every rank's tokens, with pipeline stages."""
    stage = sized.defaults.read.stage
    if stage is None:
        return None
    return SGLangPipeline(
        pp_size=stage.size, pp_rank=stage.rank,
        stage_layers=[end - start for start, end in
                      (pp_indices(stage.num_layers, rank, stage.size)
                       for rank in range(stage.size))],
        start_layer=stage.start,
        stage_tokens=list(stage.peer_tokens or (sized.own_tokens,)),
        mamba_stage_layers=stage.mamba_stage_layers or None,
        empty_mamba_pools=_empty_mamba(sized),
    )


def _empty_mamba(sized: Sized | SizedV4) -> list[SGLangEmptyMambaPool]:
    """The Mamba pools of a rank that keeps none of the model's Mamba layers (none else)."""
    if isinstance(sized, SizedV4):
        return []
    mamba, dtypes = sized.defaults.read.model.mamba, sized.defaults.mamba_dtypes
    if mamba is None or mamba.names or sized.mamba_slots is None or dtypes is None:
        return []
    return empty_mamba_pools(mamba, sized.mamba_slots, *dtypes)


def _speculative(sized: Sized, beyond: int) -> SGLangSpeculative | None:
    spec = sized.defaults.speculative
    if spec is None:
        return None
    return SGLangSpeculative(
        algorithm=spec.algorithm, num_steps=spec.num_steps, eagle_topk=spec.eagle_topk,
        num_draft_tokens=spec.num_draft_tokens, draft_layers=list(spec.layer_names()),
        draft_cell_size_bytes=sized.draft_cell_bytes, draft_beyond_budget_bytes=beyond,
        draft_window_layers=list(spec.window_layer_names()),
    )


def _with_metadata(sized: Sized) -> SGLangHisparse | None:
    """HiSparse's figures with its tensors beside the budget (hisparse/meta.py)."""
    hisparse, latent = sized.hisparse, sized.defaults.read.model.latent
    if hisparse is None or latent is None:
        return hisparse
    rows, width = sized.req_to_token
    return hisparse_metadata(hisparse, HisparseShape(
        slots=rows, context=width, layers=len(latent.names),
        page_size=sized.defaults.page_size, device_tokens=sized.tokens,
        shared_index=bool(latent.shared_index_names),
        draft_tokens=0 if sized.defaults.speculative is None
        else sized.defaults.speculative.num_draft_tokens,
    ))


def _trace_spec_swap(hisparse: SGLangHisparse, sized: Sized, trace: Trace) -> None:
    """The speculative swap's share of the metadata (hisparse/speculative.py)."""
    swap = [b for b in hisparse.metadata if b.owner == "spec_swap"]
    spec = sized.defaults.speculative
    if swap and spec is not None:
        scratch = next(b.shape[-1] for b in swap if b.name == "req_to_scratch")
        trace.add(STAGE, "sglang.speculative", "hisparse.metadata spec_swap",
                  sum(b.nbytes for b in swap),
                  f"the coordinator's speculative swap for {spec.num_draft_tokens} draft "
                  f"tokens (HiSparseSpecSwapManager): {len(swap)} GPU tables, per layer and "
                  f"request slot a hash index, a policy row and {scratch} scratch "
                  "rows")


def _placeholders(sized: Sized) -> tuple[str, ...]:
    latent = sized.defaults.read.model.latent
    if latent is None or sized.hisparse is not None:  # HiSparse indexes every layer
        return ()
    return latent.shared_index_names


def _report_v4(sized: SizedV4, placed: Placed, trace: Trace) -> SGLangPlan:
    defaults = sized.defaults
    model, page, sizes = defaults.read.model, defaults.page_size, sized.sizes
    ratios = defaults.read.model_ratios
    tokens = PoolTokens(
        page_size=page, context_length=defaults.read.settings.context_length,
        max_running_requests=sized.max_running_requests, full=sizes.full, swa=sizes.swa,
        window=model.window,
    )
    capacity = sglang_capacity(tokens)
    if sized.hisparse is not None:
        capacity = v4_capacity(capacity, sized.hisparse, sizes.c4, tokens.context_length, page,
                               sized.max_running_requests)
    return _plan(
        placed, tokens, trace, sizes.full, sized.req_to_token,
        budget=SGLangBudget(
            available_bytes=sized.available_bytes, cell_size_bytes=sized.coefficient,
            mem_fraction_static=sized.mem_fraction_static,
        ),
        deepseek_v4=SGLangDeepSeekV4(
            full_tokens=sizes.full,
            swa_tokens=sizes.swa,
            swa_full_tokens_ratio=defaults.swa_full_tokens_ratio,
            c4_tokens=sizes.c4 if 4 in ratios else 0,
            c128_tokens=sizes.c128 if 128 in ratios else 0,
            c4_index_tokens=sized.c4_index_tokens,
            c4_state_rows=sized.c4_state_rows,
            c128_state_rows=sized.c128_state_rows,
            bytes_per_full_token=sized.coefficient,
            fixed_bytes=sized.fixed_bytes,
            empty_pools=list(empty_pools(ratios, model)),
        ),
        hisparse=sized.hisparse, capacity=capacity, pipeline=_pipeline(sized),
    )


def _plan(
    placed: Placed, tokens: PoolTokens, trace: Trace, max_total_num_tokens: int,
    req_to_token: tuple[int, int], *, budget: SGLangBudget,
    hisparse: SGLangHisparse | None = None, deepseek_v4: SGLangDeepSeekV4 | None = None,
    index_placeholder_layers: tuple[str, ...] = (),
    speculative: SGLangSpeculative | None = None,
    pipeline: SGLangPipeline | None = None, capacity: Capacity | None = None,
) -> SGLangPlan:
    """The plan of the placed pools, with the capacity the pool tokens give (unless given)."""
    capacity = sglang_capacity(tokens) if capacity is None else capacity
    if trace.enabled:
        _trace_capacity(tokens, capacity, trace)
    return SGLangPlan(
        pools=list(placed.pools), tensors=list(placed.tensors), page_size=tokens.page_size,
        max_total_num_tokens=max_total_num_tokens,
        max_running_requests=tokens.max_running_requests,
        req_to_token=req_to_token_view(*req_to_token), budget=budget, hisparse=hisparse,
        deepseek_v4=deepseek_v4, speculative=speculative, capacity=capacity,
        index_placeholder_layers=list(index_placeholder_layers), pipeline=pipeline,
    )


def _trace_capacity(tokens: PoolTokens, capacity: Capacity, trace: Trace) -> None:
    pools = [f"full pool {tokens.full} tokens"]
    if tokens.swa is not None and tokens.window is not None:
        pools.append(f"window pool {tokens.swa} tokens (window {tokens.window} + a page each)")
    if tokens.mamba_slots is not None:
        pools.append(f"{tokens.mamba_slots} Mamba slots")
    if tokens.logical is not None:
        pools.append(f"{tokens.logical} HiSparse token ids")
    trace.add(STAGE, RULE, "capacity.max_concurrency", capacity.max_concurrency,
              f"the fewest {tokens.context_length}-token requests (pages of {tokens.page_size}) "
              f"any pool holds: {', '.join(pools)}; at most max_running_requests "
              f"{tokens.max_running_requests}")
    if capacity.steady_state_concurrency is not None:
        trace.add(STAGE, RULE, "capacity.steady_state_concurrency",
                  capacity.steady_state_concurrency,
                  f"each request keeping only its {tokens.hot_rows} hot rows on the GPU and "
                  "every token on the host")
