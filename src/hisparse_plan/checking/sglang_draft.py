"""`check_plan` for speculative decoding in an SGLang plan (docs/plan-contract.md#sglang-plans),
from the plan alone: the draft worker's pools (`draft_*`) exist exactly with the plan's
`speculative` figures, hold exactly its draft layers, as many tokens as the target's pools
(one allocator hands out both), and the draft's bytes a token in the cell size are the
target's per-layer bytes over its draft layers; the request table is as wide as the draft
tokens make it. A hybrid-window draft keeps its window layers (`speculative.draft_window_layers`)
in `draft_swa`, as many tokens as the target's window pool, and prices them at the target's
window layer bytes in the window part of the cell."""

from __future__ import annotations

from typing import Final

from hisparse_plan.errors import PlanInvariantError
from hisparse_plan.models.pools import Pool
from hisparse_plan.models.sglang_plan import SGLangPlan, SGLangSpeculative

INTERMEDIATE_SSM: Final = "mamba_intermediate_ssm"
INTERMEDIATE_CONV: Final = "mamba_intermediate_conv0"
DRAFT_POOLS: Final = {"draft_kv": "kv", "draft_kv_v": "kv_v", "draft_index": "index",
               "draft_swa": "swa", "draft_swa_v": "swa_v"}
"""Each draft pool and the target pool whose tokens it shares."""
WINDOW_POOLS: Final = frozenset({"draft_swa", "draft_swa_v"})
"""The draft pools of a hybrid-window draft's window layers."""
TABLE_EXTRA: Final = 4
INDEX_KEY_BYTES: Final = 132
"""A DSA index key: 128 fp8 values and one float32 scale."""


def request_table_extra(plan: SGLangPlan) -> int:
    """Columns of the request table past the context: 4, and with speculative decoding the
    draft tokens, or with pages above a token twice a decode step's allocation
    (steps x top-k or the draft tokens, the larger) plus a page less one, if that is more."""
    spec = plan.speculative
    if spec is None:
        return TABLE_EXTRA
    page = plan.page_size * plan.budget.dcp_size
    widest = TABLE_EXTRA + spec.num_draft_tokens
    if page == 1:
        return widest
    step = max(spec.num_steps * spec.eagle_topk, spec.num_draft_tokens)
    if spec.eagle_topk > 1:
        # Each branch of the tree straddles up to ceil((page - 1 + steps) / page) pages,
        # written ceil of a sum as floor: -(-(a) // b).
        straddled = -(-(page - 1 + spec.num_steps) // page)
        step = max(straddled * page * spec.eagle_topk, spec.num_draft_tokens)
    return max(widest, 2 * step + page - 1)


def hosts_draft(plan: SGLangPlan) -> bool:
    """Whether the plan's rank runs the draft worker: the only rank, or the last pipeline rank
    (SGLang's EAGLEWorkerV2 builds its draft worker where pp_group.is_last_rank)."""
    pipeline = plan.pipeline
    return pipeline is None or pipeline.pp_rank == pipeline.pp_size - 1


def check_draft(plan: SGLangPlan, pools: dict[str, Pool]) -> None:
    """The draft pools beside the target's, their layers, tokens and cell bytes; a Mamba
    hybrid's intermediate states."""
    present = [name for name in DRAFT_POOLS if name in pools]
    spec = plan.speculative
    _check_intermediates(plan, pools)
    if spec is None:
        if present:
            raise PlanInvariantError(
                f"the plan has draft pools {present} and speculative null; expected draft "
                "pools exactly with speculative figures")
        return
    hosts = hosts_draft(plan)
    if not hosts:
        if present:
            raise PlanInvariantError(
                f"pipeline rank {plan.pipeline.pp_rank if plan.pipeline else 0} has draft pools "
                f"{present}; expected none: only the last rank runs the draft worker")
    elif "draft_kv" not in pools:
        raise PlanInvariantError(
            "the plan has speculative figures and no pool 'draft_kv'; expected the draft "
            "worker's pool")
    elif bool(spec.draft_window_layers) != ("draft_swa" in pools):
        raise PlanInvariantError(
            f"the plan {'has' if 'draft_swa' in pools else 'has no'} pool 'draft_swa' and "
            f"speculative.draft_window_layers {spec.draft_window_layers}; expected the draft's "
            "window pool exactly with its window layers")
    if spec.eagle_topk == 1 and spec.num_draft_tokens != spec.num_steps + 1:
        raise PlanInvariantError(
            f"speculative.num_draft_tokens is {spec.num_draft_tokens} with eagle_topk 1; "
            f"expected num_steps + 1 = {spec.num_steps + 1} (SGLang's rule)")
    # The draft is indexed by the target allocator's ids: the full pool's tokens (under decode
    # context parallelism every rank's, in pages as many times wider), or HiSparse's logical
    # ids, a page-rounded span; and a padding page.
    blocks = (plan.max_total_num_tokens // plan.page_size + 1 if plan.hisparse is None
              else -(-plan.hisparse.logical_tokens // plan.page_size) + 1)
    for draft in present:
        shared = pools.get(DRAFT_POOLS[draft])
        want = blocks if draft not in WINDOW_POOLS else (
            None if shared is None else shared.num_blocks)
        if shared is None or pools[draft].num_blocks != want:
            raise PlanInvariantError(
                f"pool {draft!r} has {pools[draft].num_blocks} blocks; expected {want} "
                "(the draft shares the target's allocator and its token ids)")
    _check_draft_layers(plan, spec)
    _check_draft_cell(plan, spec)
    _check_beyond_budget(plan, spec, pools)


def _check_draft_layers(plan: SGLangPlan, spec: SGLangSpeculative) -> None:
    layers: dict[str, set[str]] = {}
    for tensor in plan.tensors:
        if tensor.pool in DRAFT_POOLS:
            layers.setdefault(tensor.pool, set()).update(tensor.layers)
    every, window = set(spec.draft_layers), set(spec.draft_window_layers)
    if len(every) != len(spec.draft_layers) or len(window) != len(spec.draft_window_layers):
        raise PlanInvariantError(
            f"speculative.draft_layers {spec.draft_layers} or draft_window_layers "
            f"{spec.draft_window_layers} names a layer twice; expected distinct layers")
    if not window < every:
        raise PlanInvariantError(
            f"speculative.draft_window_layers {spec.draft_window_layers}; expected some of "
            f"draft_layers {spec.draft_layers}, not all (a full layer beside them)")
    target = {layer for tensor in plan.tensors if tensor.pool not in DRAFT_POOLS
              for layer in tensor.layers}
    for name, held in layers.items():
        want = window if name in WINDOW_POOLS else every - window
        if held != want:
            raise PlanInvariantError(
                f"pool {name!r} holds layers {sorted(held)}; expected the draft's "
                f"{sorted(want)}")
    if every & target:
        raise PlanInvariantError(
            f"draft layer {sorted(every & target)[0]!r} is also the target's; expected the "
            "draft worker's own layers")


def _check_draft_cell(plan: SGLangPlan, spec: SGLangSpeculative) -> None:
    """The draft's bytes a token are the target's per-layer bytes (a full layer's K and V or
    latent row, and a DSA index key) times the draft layers (with HiSparse, times the logical
    ids a device token stands for): SGLang prices the draft at the target's geometry (on a
    pipeline rank of window layers only, the model's full shape: its window layers')."""
    rows: dict[str, int] = {}
    counts: dict[str, int] = {}
    names = {pool.name for pool in plan.pools}
    priced = ("swa", "swa_v") if plan.pipeline is not None and "kv" not in names else (
        "kv", "kv_v")
    for tensor in plan.tensors:
        if tensor.pool in priced:
            page = sum(part.size for part in tensor.ranges or [])
            rows[tensor.pool] = rows.get(tensor.pool, 0) + page * len(tensor.layers)
            counts[tensor.pool] = counts.get(tensor.pool, 0) + len(tensor.layers)
    page_bytes = sum(rows[name] // counts[name] for name in rows)
    if any(tensor.pool == "index" for tensor in plan.tensors):
        page_bytes += INDEX_KEY_BYTES * plan.page_size
    scale = plan.budget.dcp_size if plan.hisparse is None else plan.hisparse.host_to_device_ratio
    full_layers = len(spec.draft_layers) - len(spec.draft_window_layers)
    want = page_bytes * full_layers * scale
    if spec.draft_cell_size_bytes * plan.page_size != want:
        raise PlanInvariantError(
            f"speculative.draft_cell_size_bytes is {spec.draft_cell_size_bytes}; expected "
            f"{want // plan.page_size}: the target's {page_bytes // plan.page_size} bytes a "
            f"layer and token over {full_layers} draft full layers")


FULL_DRAFT_POOLS: Final = ("draft_kv", "draft_kv_v", "draft_index")
"""The draft pools priced in the full part of the cell."""


def _check_beyond_budget(plan: SGLangPlan, spec: SGLangSpeculative, pools: dict[str, Pool]
                         ) -> None:
    """The draft's full pools pass what the cell charges for them by exactly
    speculative.draft_beyond_budget_bytes: their blocks (padding aside) times what a block of
    every draft layer takes over what the price pays a draft block (draft_cell_size_bytes a
    target token, a target token standing for `scale` draft ids). Without that record a plan
    whose draft is larger than its price passes its budget unannounced."""
    beyond = 0
    if "draft_kv" in pools:
        scale = (plan.budget.dcp_size if plan.hisparse is None
                 else plan.hisparse.host_to_device_ratio)
        own = 0
        for tensor in plan.tensors:
            if tensor.pool in FULL_DRAFT_POOLS:
                own += sum(part.size for part in tensor.ranges or []) * len(tensor.layers)
        draft = pools["draft_kv"]  # under decode context parallelism a block is dcp pages
        paid = spec.draft_cell_size_bytes * (draft.block_tokens or plan.page_size) // scale
        beyond = max(0, own - paid) * (draft.num_blocks - 1)
    if spec.draft_beyond_budget_bytes != beyond:
        raise PlanInvariantError(
            f"speculative.draft_beyond_budget_bytes is {spec.draft_beyond_budget_bytes}; the "
            f"draft's pools take {beyond} bytes beyond what draft_cell_size_bytes "
            f"{spec.draft_cell_size_bytes} charges the budget "
            f"{plan.budget.available_bytes} for them; expected the two equal (a plan's pools "
            "pass its budget only by the rule it records)")


def draft_window_page_bytes(plan: SGLangPlan) -> int:
    """Bytes a page the draft's window layers add to the window part of the cell: the
    target's window layer bytes (its window pool's, and V pool's, a layer) over them."""
    spec = plan.speculative
    if spec is None or not spec.draft_window_layers:
        return 0
    pages = sum(sum(part.size for part in tensor.ranges or []) * len(tensor.layers)
                for tensor in plan.tensors if tensor.pool in ("swa", "swa_v"))
    layers = {layer for tensor in plan.tensors if tensor.pool == "swa"
              for layer in tensor.layers}
    if not layers:
        raise PlanInvariantError(
            f"speculative.draft_window_layers {spec.draft_window_layers} beside no window "
            "pool 'swa'; expected the target's window layers to price them")
    return pages // len(layers) * len(spec.draft_window_layers)

def _check_intermediates(plan: SGLangPlan, pools: dict[str, Pool]) -> None:
    """A Mamba hybrid verifying draft tokens keeps, for each running request and a padding
    slot, one recurrent state a draft token (`mamba_intermediate_ssm`: D x a temporal state a
    slot) and the conv windows (`mamba_intermediate_conv0`: D windows a slot for a tree, one
    row of D + kernel - 2 columns a channel for a chain); exactly with speculative figures and
    Mamba states."""
    ssm, conv = pools.get(INTERMEDIATE_SSM), pools.get(INTERMEDIATE_CONV)
    spec = plan.speculative
    wanted = spec is not None and "mamba_conv0" in pools
    if (ssm is not None) != wanted:
        raise PlanInvariantError(
            f"the plan {'has' if ssm is not None else 'has no'} pool {INTERMEDIATE_SSM!r}; "
            "expected it exactly with speculative figures and Mamba state pools")
    if spec is None or ssm is None or conv is None:
        return
    for pool in (ssm, conv):
        if pool.num_blocks != plan.max_running_requests + 1:
            raise PlanInvariantError(
                f"pool {pool.name!r} has {pool.num_blocks} slots; expected max_running_requests "
                f"{plan.max_running_requests} and a padding slot")
    strides = {tensor.pool: tensor for tensor in plan.tensors}
    draft = spec.num_draft_tokens
    temporal, state = strides["mamba_temporal"], strides["mamba_conv0"]
    if strides[INTERMEDIATE_SSM].block_stride != draft * temporal.block_stride:
        raise PlanInvariantError(
            f"pool {INTERMEDIATE_SSM!r} takes {strides[INTERMEDIATE_SSM].block_stride} bytes a "
            f"slot; expected {draft} temporal states of {temporal.block_stride}")
    view = (state.views or [])[0]
    channels, window = view.shape[-2], view.shape[-1]
    item = state.block_stride // (channels * window)
    shared_row = channels * (draft + window - 1) * item
    allowed = {draft * state.block_stride} if spec.eagle_topk > 1 else {shared_row}
    got = strides[INTERMEDIATE_CONV].block_stride
    if got not in allowed:
        raise PlanInvariantError(
            f"pool {INTERMEDIATE_CONV!r} takes {got} bytes a slot; expected {min(allowed)} "
            f"({draft} draft tokens' conv windows of {channels} x {window})")
