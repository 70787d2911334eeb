"""Stage 4, place: the pools and buffers SGLang's classes allocate for the sized counts
(layout.py, one builder per pool class). Arithmetic only: every count and element type was
decided before this stage. Hands the next stage the `Placed` pools and tensors."""

from __future__ import annotations

from hisparse_plan.models.base import built_for
from hisparse_plan.targets.sglang.bounds import budget_field, pools_built
from hisparse_plan.targets.sglang.deepseek_v4.hisparse import v4_host_pool
from hisparse_plan.targets.sglang.deepseek_v4.sizing import STATE_RING
from hisparse_plan.targets.sglang.layout import (
    Placed,
    hisparse_host_pool,
    index_pool,
    latent_pool,
    mamba_pools,
    mha_pool,
    v4_index_pool,
    v4_kv_pool,
    v4_state_pool,
)
from hisparse_plan.targets.sglang.model import index_row_bytes
from hisparse_plan.targets.sglang.modes import speculative
from hisparse_plan.targets.sglang.modes.pipeline_stages import hosts_draft_worker
from hisparse_plan.targets.sglang.modes.speculative_mamba import intermediate_pools
from hisparse_plan.targets.sglang.modes.speculative_window import split_draft_group
from hisparse_plan.targets.sglang.size import Sized, SizedV4
from hisparse_plan.targets.trace import Trace

STAGE = "place"
RULE = "sglang.pools"


def place(sized: Sized | SizedV4, trace: Trace) -> Placed:
    """The pools in SGLang's order: full attention, window, latent and its index keys (and
    HiSparse's host pool), Mamba states; DeepSeek-V4's window, c4 and c128 pools."""
    settings = sized.defaults.read.settings
    with built_for(budget_field(settings), pools_built(sized.defaults.page_size)):
        placed = _place_v4(sized) if isinstance(sized, SizedV4) else _place(sized)
    if trace.enabled:
        _trace_placed(placed, trace)
    return placed


def _place(sized: Sized) -> Placed:
    defaults = sized.defaults
    model, page, tokens = defaults.read.model, defaults.page_size, sized.tokens
    hisparse = sized.hisparse
    placed = Placed((), ())
    if model.full is not None and defaults.full_dtype is not None:
        placed += mha_pool("kv", model.full, tokens, page, defaults.full_dtype.store)
    swa_dtype = defaults.swa_dtype
    if model.swa is not None and sized.swa_tokens is not None and swa_dtype is not None:
        placed += mha_pool("swa", model.swa, sized.swa_tokens, page, swa_dtype.store)
    latent, row = model.latent, defaults.latent_row
    if latent is not None and row is not None:
        store = row.dtype.store
        placed += latent_pool(latent.names, tokens, page, row.elements, store)
        if latent.is_dsa:
            index_tokens = sized.index_tokens if hisparse is None else hisparse.logical_tokens
            layers = latent.index_names if hisparse is None else latent.every_layer_index()
            placed += index_pool(layers, index_tokens, page)
        if hisparse is not None:
            placed += hisparse_host_pool(latent.names, hisparse.host_tokens, page, row.elements,
                                         store)
    mamba = defaults.mamba_dtypes
    # A rank keeping none of the Mamba layers has empty pools instead (report._empty_mamba).
    if (model.mamba is not None and model.mamba.names and sized.mamba_slots is not None
            and mamba is not None):
        placed += mamba_pools(model.mamba, sized.mamba_slots, *mamba)
        if defaults.speculative is not None:
            placed += intermediate_pools(model.mamba, sized.max_running_requests,
                                         defaults.speculative, *mamba)
    return placed + _place_draft(sized)


def _place_draft(sized: Sized) -> Placed:
    """The draft worker's pools (speculative decoding): the pool classes of the target's
    attention over the draft's own layers, as many tokens as the target's full pool (one
    allocator hands out both): latent rows and every draft layer's index keys for an MLA/DSA
    model, K and V rows of the draft's heads for an MHA one (a hybrid-window draft's window
layers over the window pool's tokens). Only the last pipeline rank runs
    the draft worker; every rank's cell still prices the draft's layers."""
    defaults = sized.defaults
    spec, model, page = defaults.speculative, defaults.read.model, defaults.page_size
    if spec is None or not hosts_draft_worker(defaults.read.stage):
        return Placed((), ())
    names = spec.layer_names()
    latent, row = model.latent, defaults.latent_row
    hisparse = sized.hisparse
    if latent is not None and row is not None:
        # Under decode context parallelism the replicated draft pages every rank's ids.
        dcp = defaults.read.settings.dcp_size
        logical = None if hisparse is None else hisparse.logical_tokens
        tokens = speculative.draft_tokens(sized.tokens * dcp, logical, page)
        placed = latent_pool(names, tokens, page * dcp, row.elements, row.dtype.store)
        if latent.is_dsa:
            placed += index_pool(names, tokens, page * dcp)
        return speculative.as_draft(placed)
    group = speculative.draft_head_group(defaults.read.settings, model, spec)
    if group is None or defaults.full_dtype is None:
        return Placed((), ())
    store = defaults.full_dtype.store
    if not spec.draft_window_ids or sized.swa_tokens is None:
        return speculative.as_draft(mha_pool("kv", group, sized.tokens, page, store))
    # A hybrid-window draft: its full layers over the full tokens, its window layers over the
    # window pool's (SGLang's draft SWAKVPool, in the draft's one kv dtype).
    full, window = split_draft_group(group, spec.full_layer_names(), spec.window_layer_names())
    return speculative.as_draft(mha_pool("kv", full, sized.tokens, page, store)
                                + mha_pool("swa", window, sized.swa_tokens, page, store))


def _place_v4(sized: SizedV4) -> Placed:
    defaults = sized.defaults
    model, page, sizes = defaults.read.model, defaults.page_size, sized.sizes
    placed = v4_kv_pool("v4_swa", model.swa, sizes.swa, page, page)
    c4 = model.compressed.get(4)
    if c4:
        slots = page // 4
        placed += v4_kv_pool("v4_c4", c4, sizes.c4, slots, page)
        if sized.hisparse is not None:
            placed += v4_host_pool(c4, sized.hisparse.host_tokens, page)
        key_bytes = index_row_bytes(model.index_head_dim)
        placed += v4_index_pool(model.index_keys, sized.c4_index_tokens, slots, page, key_bytes)
        for name, layers in (("v4_state_c4", model.states[4]),
                             ("v4_index_state_c4", model.index_states)):
            placed += v4_state_pool(name, layers, sized.c4_state_rows, model.state_widths[name],
                                    STATE_RING[4], sized.c4_state_rings)
    c128 = model.compressed.get(128)
    if c128:
        placed += v4_kv_pool("v4_c128", c128, sizes.c128, page // 128, page)
        placed += v4_state_pool("v4_state_c128", model.states[128], sized.c128_state_rows,
                                model.state_widths["v4_state_c128"], STATE_RING[128],
                                sized.c128_state_rings)
    return placed


def _trace_placed(placed: Placed, trace: Trace) -> None:
    for index, pool in enumerate(placed.pools):
        blocks = f"{pool.num_blocks} blocks of {pool.block_tokens} token(s)"
        trace.add(STAGE, RULE, f"pools[{index}].size ({pool.name})", pool.size,
                  f"a {pool.allocation} {pool.location} allocation of {blocks}, block 0 padding")
    for tensor in placed.tensors:
        layers = f"{len(tensor.layers)} layer(s) from {tensor.layers[0]!r}"
        for view in tensor.views or ():
            trace.add(STAGE, RULE, f"{tensor.pool}.{view.name}",
                      f"{view.dtype} {list(view.shape)}",
                      f"strides {list(view.strides)}, storage offset {view.storage_offset}; "
                      f"{layers}, block stride {tensor.block_stride}")
