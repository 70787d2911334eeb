"""The plan-edit oracle for SGLang plans: is an `SGLangPlan` sound, judged by enumeration and by
figures recomputed here from the pools (never by check_plan, views.py or the planner's rules).

What it deems sound (the contract it tests, from docs/plan-contract.md#sglang-plans and
docs/planning-rules.md#sglang, and why):

Pools. A pool's name is its role (SGLang's adapters find pools by name, so a renamed pool is a
pool SGLang does not have): names are unique and each is one of kv, kv_v, swa, swa_v, index,
mamba_conv<i>, mamba_temporal, hisparse_host, v4_swa, v4_c4, v4_c128, v4_index_c4, v4_state_c4,
v4_index_state_c4, v4_state_c128. The role fixes the pool's place: hisparse_host alone on the
host, the Mamba and host pools one `whole` buffer (layer first), every other pool a buffer per
layer; one padding block, stage 0, and only a host pool shared. A block holds `page_size` tokens
(Mamba: 1 slot; DeepSeek-V4: page/4 or page/128 compressed slots, 8 compressor rows a window
page, 128 a request slot). Every tensor names a listed pool, states its page ranges and has its
pool's size; a per-layer tensor has layer stride 0 (the contract says so) and lists a layer
once. A tensor's views are exactly the buffers SGLang keeps over its pool (k_buffer and
v_buffer, or kv_buffer; k_buffer alone beside kv_v or swa_v, which keep v_buffer; index_k;
conv[i]; temporal; host_kv_buffer; kv_buffer / index_k / kv_score for V4), so no two share a
name. Every pool places a layer; the Mamba pools place the same layers, kv_v and hisparse_host
the layers of kv, swa_v those of swa (each keeps a part of every such layer). (swa_v: SGLang's
window pool is an MHA pool too, and keeps V apart when its V heads differ in size, as the
planner's layout.mha_pool builds it.)

Bytes, per allocation (a per_layer pool: one per layer; a whole pool: one), enumerated: every
page range of every layer and block [0, num_blocks) lies in [0, size), and no two share a byte
(SGLang has no block tables that could overlay them). Every element of every view (a whole
pool's views lead with a layer axis) lies in [0, size); no two elements of any views share a
byte (a stride 0 over more than one index, or more elements than bytes, is aliasing too). Each
view walks its tensor's pages: with r rows a block (the pool's block_tokens for a token-major
buffer, or 1 for a page-major one; whichever of the two holds), row i of layer l lies in the page
of block i // r of layer l of its own tensor; a row past the last block, or past the tensor's
layers, lies in bytes no page of the allocation owns (SGLang's spare rows). Every page byte is
reached by a view of its tensor. Views count elements, so dtype alignment holds by construction.

Figures. The full pool `kv` holds (num_blocks - 1) * page = max_total_num_tokens (`kv_v` as
many blocks); `index` covers the token ids: max_total_num_tokens, times host_to_device_ratio
with HiSparse; HiSparse's logical tokens are max_total_num_tokens * ratio, its host pool holds
logical + a page in num_blocks * page, hot rows are device_buffer_size + page and the buffer at
least top_k. Every Mamba pool has one slot count, at least max_running_requests (a running
request holds a state slot). budget.cell_size_bytes is the bytes one token takes in the counted
pools (kv, kv_v, index (x the HiSparse ratio), and a window pool at the window ratio of a
token, whose token count must then be floor(full * ratio / page) pages for the ratio the cell
implies: the plan does not state the ratio); tokens x cell fit available_bytes;
mem_fraction_static is null or in (0, 1]: SGLang 0.5.23 checks no range on
--mem-fraction-static, and its own rule, round((gpu - reserved) / gpu, 3), gives 1.0 on a GPU
whose reserve is under 0.05% of it (arg_groups/memory_hook.py), so 1.0 is a fraction it runs.
req_to_token is int32, contiguous from 0, [max_running_requests + 1, context_length + 4],
within int64 bytes. DeepSeek-V4's
figures are recomputed from its pools: full = max_total_num_tokens, c4 = full // 4, c128 =
full // 128, c4_index = c128 * 32, the window pool's pages floor(full * ratio / page), each
compressed pool's rows its tokens + a page, compressor rows 8 a window page + 9 (up to a
multiple of 4) and 128 a request slot + 129 (up to 128) with the state views that many rows,
bytes_per_full_token = cell = the pools' bytes a token (window pools at the ratio), fixed_bytes
= the c128 state buffers, or, where max_running_requests is capped at full // 2, whole rings
of them for more requests (SGLang sets them aside for the requested count before the split;
the planner's sizing_v4 does too), full x that fits available_bytes - fixed_bytes. Capacity
(context_length = the table's width - 4, a request taking whole pages) never exceeds
max_running_requests, the full pool's tokens over a request's, nor (HiSparse) the token ids
over a request's; without a window pool (whose window a plan does not state) it is exactly the
least of those and the Mamba slots. HiSparse's steady state is the least of the token ids over
a request's, the device rows over the hot rows and max_running_requests; only HiSparse has one.

What the plan alone cannot show: a same-size dtype, a renamed layer, the budget's and the window
ratio's inputs, top_k within the buffer, warnings. `check_plan` with the request must refuse
those (the fuzzer's second judge).
"""

from __future__ import annotations

import math
import re

from hisparse_plan.models.plan import KVCacheTensor
from hisparse_plan.models.pools import Pool
from hisparse_plan.models.sglang_plan import SGLangPlan
from support.plan_edit_faults import INT64_MAX, Faults, ceil_div, near, round_up
from support.plan_edit_oracle_sglang_modes import (
    DRAFT_POOLS,
    INTERMEDIATES,
    index_tokens,
    mode_faults,
    request_ids,
    table_extra,
    window_only,
)
from support.plan_edit_sglang_bytes import sglang_byte_faults

MAMBA_CONV = re.compile(r"mamba_conv\d+")
ROLES = ("kv", "kv_v", "swa", "swa_v", "index", "mamba_conv", "mamba_temporal", "hisparse_host",
         "v4_swa", "v4_c4", "v4_c128", "v4_index_c4", "v4_state_c4", "v4_index_state_c4",
         "v4_state_c128", *DRAFT_POOLS, *INTERMEDIATES)
VIEW_NAMES: dict[str, tuple[frozenset[str], ...]] = {
    "kv": (frozenset({"k_buffer", "v_buffer"}), frozenset({"kv_buffer"})),
    "swa": (frozenset({"k_buffer", "v_buffer"}),),
    "kv_v": (frozenset({"v_buffer"}),),
    "draft_kv": (frozenset({"k_buffer", "v_buffer"}), frozenset({"kv_buffer"})),
    "draft_kv_v": (frozenset({"v_buffer"}),),
    "draft_index": (frozenset({"index_k"}),),
    "mamba_intermediate_ssm": (frozenset({"intermediate_ssm"}),),
    "mamba_intermediate_conv0": (frozenset({"intermediate_conv_window[0]"}),),
    "swa_v": (frozenset({"v_buffer"}),),
    "index": (frozenset({"index_k"}),),
    "mamba_temporal": (frozenset({"temporal"}),),
    "hisparse_host": (frozenset({"host_kv_buffer"}),),
    "v4_index_c4": (frozenset({"index_k"}),),
    **dict.fromkeys(("v4_swa", "v4_c4", "v4_c128"), (frozenset({"kv_buffer"}),)),
    **dict.fromkeys(("v4_state_c4", "v4_index_state_c4", "v4_state_c128"),
                    (frozenset({"kv_score"}),)),
}
"""The buffers SGLang keeps over each pool's tensor, as sets of names (one set must match)."""
V4_FULL_POOLS = ("v4_c4", "v4_index_c4", "v4_c128")
V4_WINDOW_POOLS = ("v4_swa", "v4_state_c4", "v4_index_state_c4")
C4_STATE_ROWS_A_PAGE = 8
C128_STATE_ROWS_A_SLOT = 128
REQUEST_TABLE_EXTRA = 4


def role(name: str) -> str | None:
    """The pool's role: its name, with every mamba_conv<i> one role; None if SGLang has none."""
    if MAMBA_CONV.fullmatch(name):
        return "mamba_conv"
    return name if name in ROLES else None


def expected_block_tokens(name: str, page: int, dcp: int = 1) -> int:
    kind = role(name)
    if kind in ("mamba_conv", "mamba_temporal", *INTERMEDIATES):
        return 1
    if kind in DRAFT_POOLS:
        return page * dcp  # the draft pages as the target's allocator does
    return {
        "v4_c4": page // 4, "v4_index_c4": page // 4, "v4_c128": page // 128,
        "v4_state_c4": C4_STATE_ROWS_A_PAGE, "v4_index_state_c4": C4_STATE_ROWS_A_PAGE,
        "v4_state_c128": C128_STATE_ROWS_A_SLOT,
    }.get(name, page)


def sglang_faults(plan: SGLangPlan) -> Faults:
    """Every fault found, stopping after the first section that finds one."""
    faults = Faults()
    for section in (_structure, _figures, mode_faults, sglang_byte_faults):
        section(plan, faults)
        if faults:
            break
    return faults


# --- structure ------------------------------------------------------------------------------


def _structure(plan: SGLangPlan, faults: Faults) -> None:
    pools: dict[str, Pool] = {}
    for pool in plan.pools:
        if pool.name in pools:
            faults.add("pool names", f"two pools named {pool.name!r}")
        pools[pool.name] = pool
        _pool_role(plan, pool, faults)
    v4 = any(name.startswith("v4_") for name in pools)
    if v4 != (plan.deepseek_v4 is not None):
        faults.add("deepseek_v4 figures", f"v4 pools {v4}, deepseek_v4 figures "
                   f"{plan.deepseek_v4 is not None}")
    if ("hisparse_host" in pools) != (plan.hisparse is not None):
        faults.add("hisparse figures", "a hisparse_host pool without hisparse figures, or the "
                   "reverse")
    if not v4 and "kv" not in pools and not window_only(plan, set(pools)):
        faults.add("pool role", "no full pool 'kv'")
    for index, tensor in enumerate(plan.tensors):
        _tensor(index, tensor, pools, faults)
    _layer_sets(plan, faults)


def _layer_sets(plan: SGLangPlan, faults: Faults) -> None:
    """Every pool holds layers; pools that keep parts of the same layers keep all of them:
    every Mamba pool the same Mamba layers, kv_v and the HiSparse host pool the kv layers,
    swa_v the swa layers."""
    layers: dict[str, set[str]] = {pool.name: set() for pool in plan.pools}
    for tensor in plan.tensors:
        layers.setdefault(tensor.pool, set()).update(tensor.layers)
    for name, held in layers.items():
        if not held:
            faults.add("empty pool", f"pool {name!r} places no layer")
    mamba = {frozenset(held) for name, held in layers.items()
             if role(name) in ("mamba_conv", "mamba_temporal")}
    if len(mamba) > 1:
        faults.add("layer sets", "the Mamba pools place different layers")
    for name, of in (("kv_v", "kv"), ("hisparse_host", "kv"), ("swa_v", "swa"),
                     ("draft_kv_v", "draft_kv"), ("draft_index", "draft_kv")):
        if name in layers and layers[name] != layers.get(of):
            faults.add("layer sets", f"pool {name!r} places other layers than {of!r}")


def _pool_role(plan: SGLangPlan, pool: Pool, faults: Faults) -> None:
    kind = role(pool.name)
    if kind is None:
        faults.add("pool role", f"{pool.name!r} is no SGLang pool")
        return
    host = kind == "hisparse_host"
    whole = kind in ("mamba_conv", "mamba_temporal", "hisparse_host", *INTERMEDIATES)
    want = {
        "location": "host" if host else "device",
        "allocation": "whole" if whole else "per_layer",
        "padding_blocks": 1,
        "stage": 0,
        "block_tokens": expected_block_tokens(pool.name, plan.page_size,
                                              plan.budget.dcp_size),
    }
    for field, value in want.items():
        if getattr(pool, field) != value:
            faults.add(f"pool {field}", f"pool {pool.name!r}: {field} "
                       f"{getattr(pool, field)!r}, expected {value!r}")
    if pool.shared and not host:
        faults.add("pool shared", f"device pool {pool.name!r} marked shared")


def _view_sets(name: str, pools: dict[str, Pool]) -> tuple[frozenset[str], ...]:
    kind = role(name)
    if kind == "mamba_conv":
        return (frozenset({f"conv[{name.removeprefix('mamba_conv')}]"}),)
    if kind in ("kv", "swa", "draft_kv") and f"{kind}_v" in pools:
        return (frozenset({"k_buffer"}),)  # V apart, in kv_v or swa_v
    return VIEW_NAMES.get(kind or "", ())


def _tensor(index: int, tensor: KVCacheTensor, pools: dict[str, Pool], faults: Faults) -> None:
    pool = pools.get(tensor.pool)
    where = f"tensors[{index}]"
    if pool is None:
        faults.add("tensor pool", f"{where} names pool {tensor.pool!r}, which is not listed")
        return
    if tensor.ranges is None:
        faults.add("page ranges", f"{where} states no page ranges")
    if tensor.size != pool.size:
        faults.add("tensor size", f"{where} size {tensor.size}, its pool {pool.size}")
    if pool.allocation == "per_layer" and tensor.layer_stride != 0:
        faults.add("layer stride", f"{where} in per-layer pool {pool.name!r} has layer_stride "
                   f"{tensor.layer_stride}, expected 0")
    if len(set(tensor.layers)) != len(tensor.layers):
        faults.add("layer names", f"{where} lists a layer twice")
    names = [view.name for view in tensor.views]
    if len(set(names)) != len(names):
        faults.add("view names", f"{where} has two views of one name: {names}")
    if set(names) not in _view_sets(pool.name, pools):
        faults.add("view names", f"{where} has views {names}; SGLang keeps "
                   f"{[sorted(s) for s in _view_sets(pool.name, pools)]} over {pool.name!r}")
    for view in tensor.views:
        if len(view.shape) != len(view.strides):
            faults.add("view axes", f"{where} view {view.name!r}: {len(view.shape)} extents, "
                       f"{len(view.strides)} strides")


# --- figures --------------------------------------------------------------------------------


def _tokens(pool: Pool) -> int:
    """Tokens (or slots) a pool hands out: its blocks but the padding one."""
    return (pool.num_blocks - pool.padding_blocks) * (pool.block_tokens or 1)


def _bytes_a_block(plan: SGLangPlan, pool: Pool) -> int:
    """Bytes one block of the pool takes over all its layers (page ranges summed)."""
    return sum(
        len(t.layers) * sum(r.size for r in t.ranges or [])
        for t in plan.tensors if t.pool == pool.name
    )


def _figures(plan: SGLangPlan, faults: Faults) -> None:
    pools = {pool.name: pool for pool in plan.pools}
    _request_table(plan, faults)
    budget = plan.budget
    fraction = budget.mem_fraction_static
    if fraction is not None and not (math.isfinite(fraction) and 0 < fraction <= 1):
        faults.add("mem_fraction_static", f"{fraction!r}, expected null or in (0, 1]")
    if plan.deepseek_v4 is not None:
        _v4_figures(plan, pools, faults)
    else:
        _token_figures(plan, pools, faults)
    _capacity(plan, pools, faults)


def _request_table(plan: SGLangPlan, faults: Faults) -> None:
    table = plan.req_to_token
    rows = plan.max_running_requests + 1
    if table.dtype != "int32" or len(table.shape) != 2:
        faults.add("req_to_token", f"{table.dtype} {table.shape}, expected int32 of two axes")
        return
    width = table.shape[1]
    if table.shape[0] != rows or width < table_extra(plan) + 1:
        faults.add("req_to_token", f"shape {table.shape}, expected [{rows}, context + "
                   f"{table_extra(plan)}]")
    if list(table.strides) != [width, 1] or table.storage_offset != 0:
        faults.add("req_to_token", f"strides {table.strides} from {table.storage_offset}, "
                   f"expected [{width}, 1] from 0")
    if table.shape[0] * width * 4 > INT64_MAX:
        faults.add("req_to_token", f"{table.shape[0]} x {width} int32 is past int64 bytes")


def _token_figures(plan: SGLangPlan, pools: dict[str, Pool], faults: Faults) -> None:
    full = plan.max_total_num_tokens
    page = plan.page_size
    for values, keys in (("kv_v", "kv"), ("swa_v", "swa"), ("draft_kv_v", "draft_kv"),
                         ("draft_index", "draft_kv")):
        if values in pools and keys in pools and pools[values].num_blocks != pools[keys].num_blocks:
            faults.add(f"{values} blocks", f"{values} {pools[values].num_blocks} blocks, {keys} "
                       f"{pools[keys].num_blocks}")
    kv = pools.get("kv")
    if kv is None:
        return  # a window-only pipeline rank: plan_edit_oracle_sglang_modes judges its figures
    if _tokens(kv) != full:
        faults.add("max_total_num_tokens", f"kv holds {_tokens(kv)} tokens, the plan says {full}")
    hisparse = plan.hisparse
    ratio = 1 if hisparse is None else hisparse.host_to_device_ratio
    logical = full * ratio
    index = pools.get("index")
    if index is not None and _tokens(index) != index_tokens(plan):
        faults.add("index tokens", f"index holds {_tokens(index)} token ids, expected "
                   f"{index_tokens(plan)}")
    if hisparse is not None:
        host = pools["hisparse_host"]
        wants = {
            "logical_tokens": (hisparse.logical_tokens, logical),
            "host_tokens": (hisparse.host_tokens, logical + page),
            "hisparse_host rows": (host.num_blocks * page, hisparse.host_tokens),
            "hot_rows_per_request": (hisparse.hot_rows_per_request,
                                     hisparse.device_buffer_size + page),
        }
        for what, (got, want) in wants.items():
            if got != want:
                faults.add(f"hisparse {what}", f"{got}, expected {want}")
        if hisparse.device_buffer_size < hisparse.top_k:
            faults.add("hisparse device_buffer_size", f"{hisparse.device_buffer_size} below "
                       f"top_k {hisparse.top_k}")
    mamba = [pool for name, pool in pools.items() if role(name) in ("mamba_conv",
                                                                      "mamba_temporal")]
    if mamba:
        slots = {_tokens(pool) for pool in mamba}
        if len(slots) != 1 or min(slots) < plan.max_running_requests:
            faults.add("mamba slots", f"slots {sorted(slots)}, max_running_requests "
                       f"{plan.max_running_requests}")
    counted = sum(_bytes_a_block(plan, pools[name]) / page for name in ("kv", "kv_v")
                  if name in pools)
    if index is not None:  # the ids a device token stands for: HiSparse's or DCP's
        counted += _bytes_a_block(plan, index) / page * ratio * plan.budget.dcp_size
    if plan.speculative is not None:
        counted += plan.speculative.draft_cell_size_bytes
    cell = plan.budget.cell_size_bytes
    swa = pools.get("swa")
    if swa is None:
        if not near(cell, counted):
            faults.add("cell_size_bytes", f"{cell}, the pools give {counted}")
    else:
        window = sum(_bytes_a_block(plan, pools[name]) for name in ("swa", "swa_v")
                     if name in pools) / page
        implied = (cell - counted) / window if window else 0.0
        low = math.floor(full * implied * (1 - 1e-12) / page) * page
        high = math.floor(full * implied * (1 + 1e-12) / page) * page
        # Sized for the requests (the radix cache off), the window pool is no ratio of the
        # full one: the cell still weighs it at SGLang's ratio, the budget is the modes'.
        sized = plan.budget.swa_sized_for_requests
        if implied <= 0 or not (sized or low <= _tokens(swa) <= high):
            faults.add("cell_size_bytes", f"{cell} implies a window ratio {implied}, which "
                       f"gives {low}..{high} window tokens; swa holds {_tokens(swa)}")
        if sized:
            return
    if full * cell > plan.budget.available_bytes * (1 + 1e-12):
        faults.add("budget", f"{full} tokens x {cell} bytes exceed available_bytes "
                   f"{plan.budget.available_bytes}")


def _v4_figures(plan: SGLangPlan, pools: dict[str, Pool], faults: Faults) -> None:
    v4 = plan.deepseek_v4
    if v4 is None:
        return
    page = plan.page_size
    full = plan.max_total_num_tokens
    window = pools.get("v4_swa")
    swa_tokens = _tokens(window) if window is not None else v4.swa_tokens
    slots = plan.max_running_requests + 1
    wants: dict[str, tuple[object, object]] = {
        "full_tokens": (v4.full_tokens, full),
        "c4_tokens": (v4.c4_tokens, full // 4),
        "c128_tokens": (v4.c128_tokens, full // 128),
        "c4_index_tokens": (v4.c4_index_tokens, v4.c128_tokens * 32),
        "swa_tokens": (v4.swa_tokens, swa_tokens),
        "c4_state_rows": (v4.c4_state_rows,
                          round_up(C4_STATE_ROWS_A_PAGE * (swa_tokens // page) + 9, 4)),
        "c128_state_rows": (v4.c128_state_rows,
                            round_up(C128_STATE_ROWS_A_SLOT * slots + 129, 128)),
    }
    rows = {"v4_c4": v4.c4_tokens + page, "v4_index_c4": v4.c4_index_tokens + page,
            "v4_c128": v4.c128_tokens + page}
    for name, expected in rows.items():
        if name in pools:
            held = pools[name].num_blocks * (pools[name].block_tokens or 1)
            wants[f"{name} rows"] = (held, expected)
    for name in ("v4_state_c4", "v4_index_state_c4"):
        if name in pools and window is not None:
            wants[f"{name} blocks"] = (pools[name].num_blocks, window.num_blocks)
    if "v4_state_c128" in pools:
        wants["v4_state_c128 blocks"] = (pools["v4_state_c128"].num_blocks, slots)
    state_rows = {"v4_state_c4": v4.c4_state_rows, "v4_index_state_c4": v4.c4_state_rows,
                  "v4_state_c128": v4.c128_state_rows}
    for tensor in plan.tensors:
        if tensor.pool in state_rows:
            for view in tensor.views:
                wants[f"{tensor.pool} view rows"] = (view.shape[0], state_rows[tensor.pool])
    low = math.floor(full * v4.swa_full_tokens_ratio * (1 - 1e-12) / page) * page
    high = math.floor(full * v4.swa_full_tokens_ratio * (1 + 1e-12) / page) * page
    if not low <= swa_tokens <= high:
        wants["window pages"] = (swa_tokens, f"{low}..{high}")
    for what, (got, want) in wants.items():
        if got != want:
            faults.add(f"deepseek_v4 {what}", f"{got}, expected {want}")
    per_token = sum(_bytes_a_block(plan, pools[n]) for n in V4_FULL_POOLS if n in pools) / page
    per_token += v4.swa_full_tokens_ratio * sum(
        _bytes_a_block(plan, pools[n]) for n in V4_WINDOW_POOLS if n in pools) / page
    fixed = 0
    if "v4_state_c128" in pools:
        fixed = pools["v4_state_c128"].size * len(plan.allocation_layers(pools["v4_state_c128"]))
    if not near(v4.bytes_per_full_token, per_token):
        faults.add("deepseek_v4 bytes_per_full_token",
                   f"{v4.bytes_per_full_token}, the pools give {per_token}")
    if not near(plan.budget.cell_size_bytes, per_token):
        faults.add("cell_size_bytes", f"{plan.budget.cell_size_bytes}, the pools give "
                   f"{per_token}")
    if v4.fixed_bytes != fixed and not _set_aside_for_more(plan, v4.fixed_bytes, fixed, slots):
        faults.add("deepseek_v4 fixed_bytes", f"{v4.fixed_bytes}, the c128 states take {fixed}")
    fixed = max(fixed, v4.fixed_bytes)
    if full * per_token > (plan.budget.available_bytes - fixed) * (1 + 1e-12):
        faults.add("budget", f"{full} full tokens x {per_token} exceed available_bytes "
                   f"{plan.budget.available_bytes} less fixed {fixed}")


def _set_aside_for_more(plan: SGLangPlan, fixed_bytes: int, states: int, slots: int) -> bool:
    """fixed_bytes is the c128 states of more requests than run: SGLang sets the states aside
    for the requested running requests before it splits the rest into tokens, then caps the
    running requests at full // 2. The states are slots + 2 rings of 128 rows (the 129 extra
    rows rounded up to 128), so the set-aside is a whole number of rings, more than those."""
    rings = slots + 2
    if plan.max_running_requests != plan.max_total_num_tokens // 2 or states % rings:
        return False
    ring = states // rings
    return ring > 0 and fixed_bytes % ring == 0 and fixed_bytes // ring > rings


def _capacity(plan: SGLangPlan, pools: dict[str, Pool], faults: Faults) -> None:
    capacity = plan.capacity
    page = plan.page_size
    context = plan.req_to_token.shape[-1] - table_extra(plan)
    if context < 1:
        return  # the request table's fault is reported already
    need = ceil_div(context, page) * page
    full = plan.max_total_num_tokens
    bounds = [float(plan.max_running_requests), request_ids(plan) / need]
    mamba = [p for n, p in pools.items() if role(n) in ("mamba_conv", "mamba_temporal")]
    if mamba:
        bounds.append(float(min(_tokens(p) for p in mamba)))
    hisparse = plan.hisparse
    if hisparse is not None:
        bounds.append(hisparse.logical_tokens / need)
    exact = "swa" not in pools and plan.deepseek_v4 is None
    most = min(bounds)
    got = capacity.max_concurrency
    if (not near(got, most)) if exact else got > most * (1 + 1e-12):
        faults.add("capacity", f"max_concurrency {got}, the pools give "
                   f"{'' if exact else 'at most '}{most}")
    steady = capacity.steady_state_concurrency
    if hisparse is None:
        if steady is not None:
            faults.add("capacity", f"steady_state_concurrency {steady} without HiSparse")
        return
    want = min(hisparse.logical_tokens / need, full / hisparse.hot_rows_per_request,
               float(plan.max_running_requests))
    if steady is None or not near(steady, want):
        faults.add("capacity", f"steady_state_concurrency {steady}, the pools give {want}")
