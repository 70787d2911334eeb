"""`check_plan` for one pipeline rank's SGLang plan (`pipeline`), from the plan alone: the
ranks' layer counts are SGLang's even split (none more than one above another, the larger ones
last), the rank's first layer follows the ranks before it, every layer of the plan lies in the
rank's range, the rank's own token capacity is what its budget holds, and the pools take no
more tokens than the fewest any rank holds; a rank of a Mamba hybrid keeping none of its Mamba
layers has SGLang's empty Mamba pools in their place, one slot count, buffers of no element
(docs/plan-contract.md#sglang-plans)."""

from __future__ import annotations

import math
import re
from typing import Final

from hisparse_plan.checking.sglang_draft import DRAFT_POOLS
from hisparse_plan.errors import PlanInvariantError
from hisparse_plan.models.base import INT64_MAX
from hisparse_plan.models.pools import Pool
from hisparse_plan.models.sglang_plan import SGLangPipeline, SGLangPlan

DECODER_LAYER: Final = re.compile(r"\blayers\.(\d{1,9})\b")
EMPTY_MAMBA_VIEWS: Final = {"mamba_conv0": "conv[0]", "mamba_temporal": "temporal"}
"""The empty Mamba pools of a rank without Mamba layers, in order, and SGLang's buffer of each."""


def mamba_state_slots(plan: SGLangPlan, pools: dict[str, Pool]) -> int | None:
    """The Mamba state slots beside the padding slot: the conv pool's, or on a rank keeping
    none of the Mamba layers its empty pools'; None without Mamba states."""
    if "mamba_conv0" in pools:
        return pools["mamba_conv0"].num_blocks - 1
    empty = [] if plan.pipeline is None else plan.pipeline.empty_mamba_pools
    return empty[0].slots if empty else None


def check_pipeline(plan: SGLangPlan) -> None:
    """Raise `PlanInvariantError` at the first broken pipeline invariant (none without
    `pipeline`). A request's 4 Mamba slots (the overlap scheduler off) are not one: pipeline
    stages turn the scheduler off, and so does `--disable-overlap-schedule`, which a plan
    does not record."""
    pipeline = plan.pipeline
    if pipeline is None:
        return
    _check_ranks(pipeline)
    _check_layers(plan, pipeline)
    _check_tokens(plan, pipeline)


def check_pipeline_ranks(plan: SGLangPlan) -> None:
    """pp_rank and the per-rank lists bounded before any rule reads them by rank (the
    DeepSeek-V4 and draft rules run before check_pipeline)."""
    if plan.pipeline is not None:
        _check_ranks(plan.pipeline)


def _check_ranks(pipeline: SGLangPipeline) -> None:
    size, counts = pipeline.pp_size, pipeline.stage_layers
    if pipeline.pp_rank >= size:
        raise PlanInvariantError(
            f"pipeline.pp_rank is {pipeline.pp_rank}; expected a rank below pp_size {size}")
    for name, values in (("stage_layers", counts), ("stage_tokens", pipeline.stage_tokens)):
        if len(values) != size:
            raise PlanInvariantError(
                f"pipeline.{name} lists {len(values)} ranks; expected pp_size {size}")
    if list(counts) != sorted(counts) or counts[-1] - counts[0] > 1:
        raise PlanInvariantError(
            f"pipeline.stage_layers is {list(counts)}; expected SGLang's even split (counts "
            "at most one apart, the larger ones on the last ranks)")
    first = sum(counts[:pipeline.pp_rank])
    if pipeline.start_layer != first:
        raise PlanInvariantError(
            f"pipeline.start_layer is {pipeline.start_layer}; expected {first}, the layers of "
            f"the {pipeline.pp_rank} ranks before it")


def _check_layers(plan: SGLangPlan, pipeline: SGLangPipeline) -> None:
    start = pipeline.start_layer
    end = start + pipeline.stage_layers[pipeline.pp_rank]
    # The draft worker's layers are its own model's, numbered from 0 (sglang_draft.py).
    names = [name for tensor in plan.tensors if tensor.pool not in DRAFT_POOLS
             for name in tensor.layers]
    for name in [*names, *plan.index_placeholder_layers]:
        found = DECODER_LAYER.search(name)
        if found is None or not start <= int(found.group(1)) < end:
            raise PlanInvariantError(
                f"layer {name!r} is not one of rank {pipeline.pp_rank}'s decoder layers "
                f"[{start}, {end})", layer=name)
    mamba = {pool.name for pool in plan.pools if pool.name.startswith("mamba")}
    _check_empty_mamba(pipeline, bool(mamba))
    if bool(mamba or pipeline.empty_mamba_pools) != (pipeline.mamba_stage_layers is not None):
        raise PlanInvariantError(
            f"pipeline.mamba_stage_layers is {pipeline.mamba_stage_layers}; expected a count "
            "exactly when the plan has Mamba pools")


def _check_empty_mamba(pipeline: SGLangPipeline, pooled: bool) -> None:
    """Empty Mamba pools only without Mamba pools: conv then temporal, one slot count, each
    buffer [0, slots + 1, *state] contiguous from element 0 (so no element: no byte)."""
    empty = pipeline.empty_mamba_pools
    if not empty:
        return
    names = [pool.name for pool in empty]
    if pooled or names != list(EMPTY_MAMBA_VIEWS):
        raise PlanInvariantError(
            f"pipeline.empty_mamba_pools names {names}; expected {list(EMPTY_MAMBA_VIEWS)}, "
            "and only on a rank without Mamba state pools")
    for index, pool in enumerate(empty):
        view = pool.view
        contiguous = [math.prod(view.shape[axis + 1:]) for axis in range(len(view.shape))]
        got = (view.name, view.shape[:2], list(view.strides), view.storage_offset, pool.slots)
        want = (EMPTY_MAMBA_VIEWS[pool.name], [0, empty[0].slots + 1], contiguous, 0,
                empty[0].slots)
        if got != want:
            raise PlanInvariantError(
                f"pipeline.empty_mamba_pools[{index}] has (buffer, leading dims, strides, "
                f"storage offset, slots) {got}; expected {want}: no layer, the slots and the "
                "padding slot, contiguous")


def _check_tokens(plan: SGLangPlan, pipeline: SGLangPipeline) -> None:
    fewest = min(pipeline.stage_tokens)
    if plan.max_total_num_tokens > fewest:
        raise PlanInvariantError(
            f"max_total_num_tokens {plan.max_total_num_tokens} exceeds the fewest tokens a "
            f"pipeline rank holds, {fewest} (pipeline.stage_tokens {list(pipeline.stage_tokens)})")
    own, budget, page = pipeline.stage_tokens[pipeline.pp_rank], plan.budget, plan.page_size
    cell = budget.cell_size_bytes
    if budget.swa_sized_for_requests or not isinstance(cell, int):
        return
    if cell == 0:
        # No KV layer on the rank: SGLang's rank offers int64's largest count (in pages).
        if own != INT64_MAX // page * page:
            raise PlanInvariantError(
                f"pipeline.stage_tokens[{pipeline.pp_rank}] is {own}; a rank without KV "
                f"layers (cell_size_bytes 0) offers {INT64_MAX // page * page}, int64's "
                f"largest count in pages of {page}")
        return
    if own % page or own * cell > budget.available_bytes or (
            (own + page) * cell <= budget.available_bytes):
        raise PlanInvariantError(
            f"pipeline.stage_tokens[{pipeline.pp_rank}] is {own}; expected the whole pages of "
            f"{page} tokens budget.available_bytes {budget.available_bytes} holds at "
            f"cell_size_bytes {cell}, {budget.available_bytes // cell // page * page}")
