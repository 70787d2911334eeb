"""The SGLang plan-edit oracle's server modes: speculative decoding, pipeline stages, decode
context parallelism, HiSparse's metadata, the radix cache off and shared-index placeholders,
each judged by figures recomputed here from the plan's pools and stated counts (never by
check_plan, views.py, checking/* or targets/*). plan_edit_oracle_sglang calls it for every plan
it judges.

What it deems sound, and why (docs/plan-contract.md#sglang-plans, docs/planning-rules.md
#sglang-server-modes, #sglang-speculative-decoding, #sglang-pipeline, and SGLang 0.5.23):

Speculative decoding (EAGLE family). `speculative` null means no draft pools and no Mamba
intermediate pools. With it: with top-k 1 the draft tokens are steps + 1 (SGLang forces it);
top-k above 1 on pages above a token never with a DSA model (an `index` pool): SGLang's
speculative hook runs such a tree only on its flashinfer, fa3 and triton backends, not dsa.
The draft worker runs on the only rank or the last pipeline rank (EAGLEWorkerV2 builds it where
pp_group.is_last_rank): there `draft_kv` exists, elsewhere no draft pool does. `draft_kv_v` and
`draft_index` exist only beside `draft_kv`, `draft_index` only for a DSA target (an `index`
pool). Every draft pool holds exactly `draft_layers` (distinct, none a target layer: the draft
model's own ids). The draft worker shares the target's allocator, so a draft pool's tokens
beside its padding block are the ids that allocator hands out, in whole allocator pages: the
full pool's tokens x dcp_size (decode context parallelism: the allocator pages dcp_size pages
at once, so a draft block is page x dcp_size tokens), or with HiSparse its logical ids rounded
up to a page. The draft is priced into the cell at the target's geometry (SGLang's
DefaultPoolConfigurator adds draft layers x the target's per-layer bytes): draft_cell_size_bytes
x page = draft layers x (a `kv` layer's page + a `kv_v` layer's page + an `index` layer's page)
x the ids a stored token stands for (HiSparse's ratio, or dcp_size), its full layers only; a
pipeline rank of window layers only prices them by a window layer (the model's full shape is
its window layers', planning-rules.md), and counts its whole cell without a ratio (its window
pool, the draft's full layers and its window layers at a window layer's bytes); another plan
without a full pool has no geometry to price a draft by. A Mamba hybrid keeps intermediates
exactly with speculative decoding: `mamba_intermediate_ssm` and `mamba_intermediate_conv0`,
the Mamba layers, max_running_requests + 1 slots, a slot D temporal states of a layer (D =
num_draft_tokens), and conv windows: a tree (top-k > 1) D of them, a chain one row of D +
window - 1 columns a channel. The request table is context + SGLang's extra columns wide
(allocation_sizing.get_req_to_token_extra_context_len, recomputed in `table_extra`).

Pipeline stages. pp_rank < pp_size; stage_layers and stage_tokens one a rank; stage_layers is
SGLang's get_pp_indices split of their sum (total // pp each, the last total % pp ranks one
more); start_layer the layers of the ranks before; every layer of the target (placeholders too)
is a decoder layer `layers.K` of the rank's range; max_total_num_tokens at most the fewest
stage_tokens (SGLang's MIN all-reduce); the rank's own stage_tokens is what its budget holds in
whole pages at an integer cell (available // cell, floored to a page; a float cell or a window
pool sized for requests states no such figure); mamba_stage_layers exactly with Mamba pools, at
least the rank's own Mamba layers and at most the largest rank's layers. A rank of window
layers only (no `kv`, a `swa` pool) is SGLang's all-window pool: 1-token pages, the window
pool holds max_total_num_tokens, the cell is its bytes a token, no draft.

Mamba slots. budget.mamba_slots_per_request is null exactly without Mamba pools (null means 5;
4 with the overlap scheduler off, by pipeline stages or by hand, 1 with the radix cache off);
max_running_requests x that many slots fit the pools' slots (a running request holds them).

Decode context parallelism: dcp_size > 1 only for a DSA model (an `index` pool) without
HiSparse; the index keys cover every rank's ids, (full + page) x dcp - page tokens beside the
padding page, are charged dcp_size times in the cell, and a request's context counts against
full x dcp_size ids.

The radix cache off (budget.swa_sized_for_requests): only with a window pool; the window pool
is then not the cell's ratio of the full one, so the budget must cover the full tokens at the
full layers' bytes and the window pages at their own bytes.

HiSparse metadata: empty (plans before the field) or exactly SGLang's set (its coordinator,
host pool and allocator), each shape from R = req_to_token rows, W its width, L the `kv`
layers, D the device buffer, K top_k, P the page, the host tokens, the logical ids and the
device tokens, as SGLang's HiSparseCoordinator allocates them (pinned in
tests/targets/sglang/test_sglang_hisparse_meta.py), the shared-index miss plan all three or none and
K x max(1, N) wide for N draft tokens, with speculative decoding the speculative swap's seven
tables (`_spec_swap_table`, HiSparseSpecSwapManager's shapes), nbytes the shape's elements times
the element size.

Shared-index placeholders: only beside an index pool and without HiSparse; distinct `kv`
layers, and with the index layers exactly one index buffer for each `kv` layer, paired by the
layer id SGLang's buffer gets (the SGLang adapter's: the number after `layers.`, else the first
number in the name): SGLang keeps one index_k buffer per layer id, real or zero-row, so two for
one id and none for another is a layout it does not have.

DP attention leaves nothing in a plan (a rank's pools are a group's): only check_plan with the
request can judge it.
"""

from __future__ import annotations

import re
from fractions import Fraction
from math import prod

from hisparse_plan.models.pools import Pool
from hisparse_plan.models.sglang_plan import SGLangPlan
from support.plan_edit_faults import Faults, round_up

DRAFT_POOLS = ("draft_kv", "draft_kv_v", "draft_index")
INTERMEDIATES = ("mamba_intermediate_ssm", "mamba_intermediate_conv0")
TABLE_BASE = 4
DECODER = re.compile(r"\blayers\.(\d+)\b")
LAYER_ID = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")
NUMBER = re.compile(r"\d+")
ELEMENT = {"bool": 1, "uint8": 1, "int16": 2, "int32": 4, "int64": 8, "uint64": 8}
MISS = ("_miss_src", "_miss_dst", "_miss_count")


def is_mamba(name: str) -> bool:
    return name.startswith("mamba_") and name not in INTERMEDIATES


def window_only(plan: SGLangPlan, names: set[str]) -> bool:
    """A pipeline rank keeping window layers only: a window pool and no full pool."""
    return plan.pipeline is not None and "swa" in names and "kv" not in names


def dcp(plan: SGLangPlan) -> int:
    return plan.budget.dcp_size


def layers_of(plan: SGLangPlan, pool: str) -> list[str]:
    return [layer for t in plan.tensors if t.pool == pool for layer in t.layers]


def page_bytes(plan: SGLangPlan, pool: str) -> int:
    """Bytes one block of `pool` takes over all its layers."""
    return sum(len(t.layers) * sum(r.size for r in t.ranges or [])
               for t in plan.tensors if t.pool == pool)


def table_extra(plan: SGLangPlan) -> int:
    """Request-table columns past the context (SGLang's get_req_to_token_extra_context_len)."""
    spec = plan.speculative
    if spec is None:
        return TABLE_BASE
    return extra_columns(plan.page_size * dcp(plan), spec.num_steps, spec.eagle_topk,
                         spec.num_draft_tokens)


def extra_columns(alloc_page: int, steps: int, topk: int, drafts: int) -> int:
    """With speculative decoding: 4 + the draft tokens, and with allocator pages above a token
    at least a double decode allocation plus a page less one (get_alloc_len_per_decode: a
    chain's max(steps x top-k, drafts), a tree's straddled pages a branch)."""
    extra = TABLE_BASE + drafts
    if alloc_page == 1:
        return extra
    if topk == 1:
        per_decode = max(steps * topk, drafts)
    else:
        pages_a_branch = (alloc_page - 1 + steps + alloc_page - 1) // alloc_page
        per_decode = max(pages_a_branch * alloc_page * topk, drafts)
    return max(extra, 2 * per_decode + alloc_page - 1)


def mode_faults(plan: SGLangPlan, faults: Faults) -> None:
    pools = {pool.name: pool for pool in plan.pools}
    for section in (_speculative, _pipeline, _mamba_slots, _dcp, _radix_off, _hisparse_meta,
                    _placeholders):
        section(plan, pools, faults)
        if faults:
            return


# --- speculative decoding ----------------------------------------------------------------


def _speculative(plan: SGLangPlan, pools: dict[str, Pool], faults: Faults) -> None:
    spec = plan.speculative
    drafts = [name for name in DRAFT_POOLS if name in pools]
    mids = [name for name in INTERMEDIATES if name in pools]
    mamba = any(is_mamba(name) for name in pools)
    if spec is None:
        if drafts or mids:
            faults.add("speculative pools", f"pools {drafts + mids} without speculative")
        return
    if spec.eagle_topk == 1 and spec.num_draft_tokens != spec.num_steps + 1:
        faults.add("speculative draft tokens", f"{spec.num_draft_tokens} with top-k 1 and "
                   f"{spec.num_steps} steps")
    hosts = plan.pipeline is None or plan.pipeline.pp_rank == plan.pipeline.pp_size - 1
    if hosts != ("draft_kv" in pools) or (drafts and not hosts):
        faults.add("speculative pools", f"draft pools {drafts} on a rank that "
                   f"{'hosts' if hosts else 'does not host'} the draft worker")
    if spec.eagle_topk > 1 and plan.page_size > 1 and "index" in pools:
        faults.add("speculative draft tree", f"top-k {spec.eagle_topk} on {plan.page_size}-token "
                   "pages of a DSA model, which SGLang's dsa backend does not run")
    if "draft_index" in pools and "index" not in pools:
        faults.add("speculative pools", "draft_index for a target without index keys")
    if "draft_kv_v" in pools and "draft_kv" not in pools:
        faults.add("speculative pools", "draft_kv_v without draft_kv")
    if sorted(mids) != (sorted(INTERMEDIATES) if mamba else []):
        faults.add("mamba intermediates", f"pools {mids} with Mamba states {mamba}")
    if faults:
        return
    _draft_pools(plan, pools, drafts, faults)
    _draft_price(plan, pools, faults)
    _draft_beyond_budget(plan, pools, faults)
    if mids:
        _intermediates(plan, pools, faults)


def _draft_pools(plan: SGLangPlan, pools: dict[str, Pool], drafts: list[str],
                 faults: Faults) -> None:
    spec = plan.speculative
    if spec is None:
        return
    want = list(spec.draft_layers)
    if len(set(want)) != len(want):
        faults.add("draft layers", f"{want} names a layer twice")
    target = {layer for t in plan.tensors if t.pool not in DRAFT_POOLS for layer in t.layers}
    if set(want) & target:
        faults.add("draft layers", f"{sorted(set(want) & target)} are target layers too")
    ids = (plan.max_total_num_tokens * dcp(plan) if plan.hisparse is None
           else plan.hisparse.logical_tokens)
    alloc_page = plan.page_size * dcp(plan)
    for name in drafts:
        held = layers_of(plan, name)
        if sorted(held) != sorted(want):
            faults.add("draft layers", f"pool {name!r} holds {held}, the draft {want}")
        pool = pools[name]
        tokens = (pool.num_blocks - 1) * (pool.block_tokens or 1)
        if tokens != round_up(ids, alloc_page):
            faults.add("draft tokens", f"pool {name!r} holds {tokens} tokens; the target's "
                       f"allocator hands out {ids} ids in pages of {alloc_page}")


def _draft_price(plan: SGLangPlan, pools: dict[str, Pool], faults: Faults) -> None:
    spec = plan.speculative
    if spec is None:
        return
    # A window-only rank: the model's full shape is its window layers' (planning-rules.md).
    priced = ("swa", "swa_v") if window_only(plan, set(pools)) else ("kv", "kv_v", "index")
    if priced[0] not in pools:
        faults.add("draft price", "a draft with no full pool to price it by")
        return
    a_layer = Fraction(0)
    for name in priced:
        count = len(layers_of(plan, name))
        if count:
            a_layer += Fraction(page_bytes(plan, name), count)
    scale = dcp(plan) if plan.hisparse is None else plan.hisparse.host_to_device_ratio
    full_layers = len(spec.draft_layers) - len(spec.draft_window_layers)
    price = a_layer * full_layers * scale
    if spec.draft_cell_size_bytes * plan.page_size != price:
        faults.add("draft price", f"draft_cell_size_bytes {spec.draft_cell_size_bytes}, the "
                   f"target's geometry gives {price / plan.page_size}")


def _draft_beyond_budget(plan: SGLangPlan, pools: dict[str, Pool], faults: Faults) -> None:
    """The budget pays draft_cell_size_bytes a target token, scale draft ids of it; the draft
    pools hold their own shape a draft token: what they take beyond the price, over every
    token they hold beside the padding page, is the plan's stated excess (0 if none)."""
    spec = plan.speculative
    if spec is None:
        return
    beyond = Fraction(0)
    if "draft_kv" in pools:
        pool = pools["draft_kv"]
        block = pool.block_tokens or 1
        own = sum(Fraction(page_bytes(plan, name), block)
                  for name in ("draft_kv", "draft_kv_v", "draft_index"))
        scale = dcp(plan) if plan.hisparse is None else plan.hisparse.host_to_device_ratio
        paid = Fraction(spec.draft_cell_size_bytes, scale)
        beyond = max(Fraction(0), own - paid) * (pool.num_blocks - 1) * block
    if spec.draft_beyond_budget_bytes != beyond:
        faults.add("draft past the budget", f"draft_beyond_budget_bytes "
                   f"{spec.draft_beyond_budget_bytes}, the draft's own shape takes {beyond} "
                   "beyond its price")


def _slot_bytes(plan: SGLangPlan, pool: str) -> Fraction:
    """Bytes one slot of a whole Mamba pool takes for one layer."""
    return Fraction(page_bytes(plan, pool), max(1, len(layers_of(plan, pool))))


def _intermediates(plan: SGLangPlan, pools: dict[str, Pool], faults: Faults) -> None:
    spec = plan.speculative
    if spec is None:
        return
    states = set(layers_of(plan, "mamba_temporal"))
    for name in INTERMEDIATES:
        if set(layers_of(plan, name)) != states:
            faults.add("mamba intermediates", f"pool {name!r} holds other layers than the "
                       "Mamba states")
        if pools[name].num_blocks != plan.max_running_requests + 1:
            faults.add("mamba intermediates", f"pool {name!r} has {pools[name].num_blocks} "
                       f"slots for {plan.max_running_requests} running requests")
    drafts = spec.num_draft_tokens
    ssm = _slot_bytes(plan, "mamba_intermediate_ssm")
    if ssm != drafts * _slot_bytes(plan, "mamba_temporal"):
        faults.add("mamba intermediates", f"a slot of {ssm} bytes a layer for {drafts} "
                   "temporal states")
    conv = next(t for t in plan.tensors if t.pool == "mamba_conv0")
    shape = conv.views[0].shape if conv.views else []
    if len(shape) < 2:
        return  # the views' fault is the byte section's
    channels, window = shape[-2], shape[-1]
    one = _slot_bytes(plan, "mamba_conv0")
    item = one / (channels * window)
    want = drafts * one if spec.eagle_topk > 1 else channels * (drafts + window - 1) * item
    got = _slot_bytes(plan, "mamba_intermediate_conv0")
    if got != want:
        faults.add("mamba intermediates", f"conv windows of {got} bytes a slot and layer, "
                   f"expected {want}")


# --- pipeline stages -----------------------------------------------------------------------


def _pipeline(plan: SGLangPlan, pools: dict[str, Pool], faults: Faults) -> None:
    names = set(pools)
    if window_only(plan, names):
        _window_only(plan, pools, faults)
    stages = plan.pipeline
    if stages is None:
        return
    size, rank = stages.pp_size, stages.pp_rank
    counts, tokens = list(stages.stage_layers), list(stages.stage_tokens)
    if rank >= size or len(counts) != size or len(tokens) != size:
        faults.add("pipeline ranks", f"rank {rank} of {size}, {len(counts)} layer counts, "
                   f"{len(tokens)} token counts")
        return
    total = sum(counts)
    split = [total // size + (i >= size - total % size) for i in range(size)]
    if counts != split:
        faults.add("pipeline split", f"stage_layers {counts}, SGLang splits {total} as {split}")
    start = sum(counts[:rank])
    if stages.start_layer != start:
        faults.add("pipeline start", f"start_layer {stages.start_layer}, expected {start}")
    end = start + counts[rank]
    own = [layer for t in plan.tensors if t.pool not in DRAFT_POOLS for layer in t.layers]
    for layer in own + list(plan.index_placeholder_layers):
        found = DECODER.search(layer)
        if found is None or not stages.start_layer <= int(found.group(1)) < end:
            faults.add("pipeline layers", f"{layer!r} outside the rank's [{start}, {end})")
            return
    if plan.max_total_num_tokens > min(tokens):
        faults.add("pipeline tokens", f"{plan.max_total_num_tokens} above the fewest a rank "
                   f"holds, {min(tokens)}")
    budget = plan.budget
    cell = budget.cell_size_bytes
    if isinstance(cell, int) and not budget.swa_sized_for_requests:
        fits = budget.available_bytes // cell // plan.page_size * plan.page_size
        if tokens[rank] != fits:
            faults.add("pipeline tokens", f"stage_tokens[{rank}] {tokens[rank]}, its budget "
                       f"holds {fits}")
    mamba = [name for name in pools if is_mamba(name)]
    held = len(set(layers_of(plan, "mamba_temporal")))
    most = stages.mamba_stage_layers
    if bool(mamba) != (most is not None) or (most is not None and not held <= most <= max(
            counts)):
        faults.add("pipeline mamba layers", f"mamba_stage_layers {most}, the rank keeps "
                   f"{held} Mamba layers, the largest rank {max(counts)} layers")


def _window_only(plan: SGLangPlan, pools: dict[str, Pool], faults: Faults) -> None:
    swa = pools["swa"]
    held = (swa.num_blocks - 1) * plan.page_size
    window = Fraction(page_bytes(plan, "swa") + page_bytes(plan, "swa_v"))
    spec = plan.speculative
    if spec is not None:  # the draft's full layers (its price) and window layers, whole
        a_window = Fraction(window, max(1, len(layers_of(plan, "swa"))))
        window += spec.draft_cell_size_bytes * plan.page_size + a_window * len(
            spec.draft_window_layers)
    if plan.page_size != 1:
        faults.add("window-only rank", f"page_size {plan.page_size}, SGLang's all-window "
                   "allocator takes 1")
    if held != plan.max_total_num_tokens:
        faults.add("window-only rank", f"swa holds {held} tokens, max_total_num_tokens "
                   f"{plan.max_total_num_tokens}")
    if plan.budget.cell_size_bytes * plan.page_size != window:
        faults.add("window-only rank", f"cell {plan.budget.cell_size_bytes}, the window pool "
                   f"takes {window / plan.page_size} a token")
    if plan.max_total_num_tokens * plan.budget.cell_size_bytes > plan.budget.available_bytes:
        faults.add("budget", "the window pool's tokens exceed available_bytes")
    if plan.budget.swa_sized_for_requests:
        faults.add("window-only rank", "a window pool sized for requests on a rank without a "
                   "full pool")


# --- Mamba slots, decode context parallelism, the radix cache off --------------------------


def _mamba_slots(plan: SGLangPlan, pools: dict[str, Pool], faults: Faults) -> None:
    stated = plan.budget.mamba_slots_per_request
    slots = pools.get("mamba_conv0")
    if slots is None:
        if stated is not None:
            faults.add("mamba slots", f"mamba_slots_per_request {stated} without Mamba pools")
        return
    per = 5 if stated is None else stated
    if plan.max_running_requests * per > slots.num_blocks - 1:
        faults.add("mamba slots", f"{plan.max_running_requests} requests x {per} slots, the "
                   f"pools hold {slots.num_blocks - 1}")


def _dcp(plan: SGLangPlan, pools: dict[str, Pool], faults: Faults) -> None:
    if dcp(plan) > 1 and ("index" not in pools or plan.hisparse is not None):
        faults.add("dcp_size", f"{dcp(plan)} without an index pool or with HiSparse")


def _radix_off(plan: SGLangPlan, pools: dict[str, Pool], faults: Faults) -> None:
    budget = plan.budget
    if not budget.swa_sized_for_requests:
        return
    if "swa" not in pools or "kv" not in pools:
        faults.add("swa_sized_for_requests", "a window pool sized for requests needs a full "
                   "pool and a window pool")
        return
    full = Fraction(sum(page_bytes(plan, n) for n in ("kv", "kv_v")), plan.page_size)
    full += Fraction(page_bytes(plan, "index") * dcp(plan), plan.page_size)
    if plan.speculative is not None:
        full += plan.speculative.draft_cell_size_bytes
    window_pages = pools["swa"].num_blocks - 1
    used = plan.max_total_num_tokens * full + window_pages * (
        page_bytes(plan, "swa") + page_bytes(plan, "swa_v"))
    if used > budget.available_bytes:
        faults.add("budget", f"full and window pools take {float(used)} bytes, available "
                   f"{budget.available_bytes}")


# --- HiSparse metadata, shared-index placeholders ------------------------------------------


def _hisparse_table(plan: SGLangPlan) -> dict[tuple[str, str], tuple[str, str, list[int]]]:
    h = plan.hisparse
    if h is None:
        return {}
    rows, width = plan.req_to_token.shape
    p, d, k = plan.page_size, h.device_buffer_size, h.top_k
    layers = len(layers_of(plan, "kv"))
    gpu = "device"
    drafts = 0 if plan.speculative is None else plan.speculative.num_draft_tokens
    miss = k * max(1, drafts)  # the miss plan holds every draft token's top-k
    return {**_spec_swap_table(plan, drafts, layers), **{
        ("coordinator", "req_to_device_buffer"): (gpu, "int64", [rows, d + p]),
        ("coordinator", "req_device_buffer_size"): ("host", "int64", [rows]),
        ("coordinator", "req_to_host_pool"): (gpu, "int64", [rows, width + p]),
        ("coordinator", "req_to_host_pool_allocated_len"): ("host", "int64", [rows]),
        ("coordinator", "req_device_buffer_tokens"): (gpu, "int32", [layers, rows, d + p]),
        ("coordinator", "req_device_buffer_token_locs"): (gpu, "int32", [layers, rows, d + p]),
        ("coordinator", "_lru_init"): (gpu, "int16", [d]),
        ("coordinator", "lru_slots"): (gpu, "int16", [layers, rows, d]),
        ("coordinator", "_device_buffer_arange_i32"): (gpu, "int32", [d]),
        ("coordinator", "top_k_device_locs_buffer"): (gpu, "int32", [rows, k]),
        ("coordinator", "raw_indices_buffer"): (gpu, "int32", [rows, k]),
        ("coordinator", "num_real_reqs"): (gpu, "int32", [1]),
        ("coordinator", "_miss_src"): (gpu, "int64", [rows, miss]),
        ("coordinator", "_miss_dst"): (gpu, "int32", [rows, miss]),
        ("coordinator", "_miss_count"): (gpu, "int32", [rows]),
        ("host_pool", "data_ptrs"): (gpu, "uint64", [layers]),
        ("host_pool", "free_slots"): ("host", "int64", [h.host_tokens]),
        ("host_pool", "mem_state"): ("host", "uint8", [h.host_tokens]),
        ("host_pool", "slot_used"): ("host", "bool", [h.host_tokens]),
        ("allocator", "full_to_hisparse_device_index_mapping"): (
            gpu, "int64", [h.logical_tokens + p + 1]),
        ("allocator.hisparse", "free_pages"): (gpu, "int64", [plan.max_total_num_tokens // p]),
        ("allocator.logical", "free_pages"): (gpu, "int64", [h.logical_tokens // p]),
    }}


def _spec_swap_table(
    plan: SGLangPlan, drafts: int, layers: int
) -> dict[tuple[str, str], tuple[str, str, list[int]]]:
    """HiSparseSpecSwapManager's GPU tables with N > 0 draft tokens (none without drafts), as
    hisparse_coordinator.py shapes them over S = req_to_token's rows, the unpadded hot buffer D
    and top-k K: a hash index 2 x the power of two above 2D - 1 wide a layer and slot, an LRU
    policy of D a layer and slot (one slot more), N x K occurrences' scratch rows
    (min(NK, max(1024, NK - D))), a state row a slot (one more) of max(4S, 5NK) counters,
    K top-k rows per draft token, and the D hash slots and entries."""
    h = plan.hisparse
    if h is None or drafts == 0:
        return {}
    slots, d, k = plan.req_to_token.shape[0], h.device_buffer_size, h.top_k
    work = drafts * k
    hashed = 1 << max(1, (2 * d - 1).bit_length())
    gpu = "device"
    return {
        ("spec_swap", "_cache_index"): (gpu, "int64", [layers, slots, 2, hashed]),
        ("spec_swap", "_cache_policy"): (gpu, "int32", [layers, slots + 1, d]),
        ("spec_swap", "_scratch_state"): (gpu, "int32", [slots + 1, max(4 * slots, 5 * work)]),
        ("spec_swap", "req_to_scratch"): (gpu, "int32",
                                          [layers, slots, min(work, max(1024, work - d))]),
        ("spec_swap", "top_k_device_locs"): (gpu, "int32", [slots, drafts, k]),
        ("spec_swap", "_hash_slots"): (gpu, "int64", [d]),
        ("spec_swap", "_hash_entries"): (gpu, "int64", [d]),
    }


def _hisparse_meta(plan: SGLangPlan, pools: dict[str, Pool], faults: Faults) -> None:
    h = plan.hisparse
    if h is None or not h.metadata:
        return
    table = _hisparse_table(plan)
    listed = [(b.owner, b.name) for b in h.metadata]
    with_miss = any(name in MISS for _, name in listed)
    want = {key for key in table if with_miss or key[1] not in MISS}
    if len(set(listed)) != len(listed) or set(listed) != want:
        faults.add("hisparse metadata", f"lists {sorted(set(listed) ^ want)} against SGLang's "
                   "set, or one twice")
        return
    for b in h.metadata:
        place, dtype, shape = table[(b.owner, b.name)]
        if (b.location, b.dtype, list(b.shape)) != (place, dtype, shape):
            faults.add("hisparse metadata", f"{b.owner}.{b.name} {b.location} {b.dtype} "
                       f"{b.shape}, expected {place} {dtype} {shape}")
        if b.nbytes != prod(b.shape) * ELEMENT[b.dtype]:
            faults.add("hisparse metadata", f"{b.owner}.{b.name} nbytes {b.nbytes}")


def _placeholders(plan: SGLangPlan, pools: dict[str, Pool], faults: Faults) -> None:
    held = list(plan.index_placeholder_layers)
    if not held:
        return
    latent = layers_of(plan, "kv")
    index = layers_of(plan, "index")
    if not index or plan.hisparse is not None:
        faults.add("index placeholders", "placeholders without an index pool or with HiSparse")
        return
    # An index layer is named for its indexer (layers.K.self_attn.indexer...): match by K,
    # the layer id SGLang's buffer of that name gets.
    if len(set(held)) != len(held) or not set(held) <= set(latent) or sorted(
            _decoders(held) + _decoders(index)) != sorted(_decoders(latent)):
        faults.add("index placeholders", f"placeholders {held} and index layers {index} are "
                   f"not the latent layers {latent}, each once")


def _decoders(layers: list[str]) -> list[int]:
    """SGLang's layer id of each name, as the SGLang adapter maps names to SGLang's buffers:
    the number after `layers.`, else the first number; -1 for a name without one."""
    found = []
    for name in layers:
        match = LAYER_ID.search(name) or NUMBER.search(name)
        found.append(-1 if match is None else int(match.group(match.lastindex or 0)))
    return found


def index_tokens(plan: SGLangPlan) -> int:
    """Token ids the index keys cover beside their padding page: the full pool's (every DCP
    rank's, less one padding page), or HiSparse's logical ids."""
    if plan.hisparse is not None:
        return plan.hisparse.logical_tokens
    page = plan.page_size
    return (plan.max_total_num_tokens + page) * dcp(plan) - page


def request_ids(plan: SGLangPlan) -> int:
    """Token ids a request's context is counted against in the full pool."""
    return plan.max_total_num_tokens * dcp(plan)
