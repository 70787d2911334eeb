"""An SGLangPlan projected onto the reference report: what SGLang's own pool objects would
show (pools, each buffer's layer id, dtype, shape, strides, storage), so that a plan and a run
of SGLang compare field by field (references/sglang_diff.py)."""

from __future__ import annotations

import re
from typing import Any, Final

from hisparse_plan.checking import check_plan
from hisparse_plan.checking.sglang_roles import mamba_only_rank
from hisparse_plan.errors import PlanError
from hisparse_plan.models.any_plan import expect_plan
from hisparse_plan.models.json_input import excerpt
from hisparse_plan.models.plan import KVCacheTensor
from hisparse_plan.models.pools import BufferView, Pool
from hisparse_plan.models.sglang_plan import SGLangDeepSeekV4, SGLangPlan
from hisparse_plan.targets.sglang.model import INDEX_ROW_BYTES
from hisparse_plan.targets.sglang.modes.speculative import DRAFT_PREFIX

_LAYER_ID: Final = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")
_ANY_NUMBER: Final = re.compile(r"\d+")
LAYER_ID_DIGITS: Final = 18
"""A layer index fits an int64 with room to spare."""
SEPARATE_V_SUFFIX: Final = "_v"
"""The planner keeps V in a pool of its own (`kv_v`) when K and V differ in head size; SGLang
keeps both in one pool object, which the report names once (`kv`)."""


def layer_id(name: str, position: int) -> int:
    """The model's layer index of a request layer name: the number after `layers.`
    (`model.layers.7.self_attn.attn` -> 7; a DSA model's index keys,
    `model.layers.7.self_attn.indexer.k_cache`, share their latent layer's id), else the first
    number in the name, else the layer's `position` in its tensor."""
    if not isinstance(name, str):
        raise PlanError(f"layer: expected a layer name (str), got {type(name).__name__}",
                        field="tensors")
    match = _LAYER_ID.search(name) or _ANY_NUMBER.search(name)
    if match is None:
        return position
    digits = match.group(1) if match.re is _LAYER_ID else match.group(0)
    if len(digits) > LAYER_ID_DIGITS:
        # int() of thousands of digits is Python's ValueError; no model has such a layer.
        raise PlanError(
            f"tensors: layer {excerpt(name, 80)} numbers its layer with {len(digits)} digits; "
            f"expected a layer index of at most {LAYER_ID_DIGITS} digits", field="tensors",
        )
    return int(digits)


def _pool_tokens(plan: SGLangPlan, pool: Pool, tensor: KVCacheTensor | None) -> int:
    """The token (or slot) count SGLang's pool object reports as its size."""
    hisparse = plan.hisparse
    v4 = plan.deepseek_v4
    if v4 is not None:
        return _v4_pool_tokens(v4, pool)
    if pool.name == "kv":
        return plan.max_total_num_tokens
    if pool.name == "index":
        if hisparse is not None:
            return hisparse.logical_tokens
        page = plan.page_size
        return (plan.max_total_num_tokens + page) * plan.budget.dcp_size - page
    if pool.name == "hisparse_host" and hisparse is not None:
        return hisparse.host_tokens
    if pool.block_tokens == 1 and pool.allocation == "whole":  # Mamba state slots
        return pool.num_blocks - pool.padding_blocks
    if tensor is not None and tensor.views and pool.block_tokens is not None:
        # Token rows [size + page_size, ...]: the padding page is not handed out.
        return tensor.views[0].shape[0] - pool.block_tokens * pool.padding_blocks
    return (pool.num_blocks - pool.padding_blocks) * (pool.block_tokens or 1)


def _draft_tokens(pool: Pool, tensor: KVCacheTensor | None) -> int:
    """A draft pool's size as SGLang reports it: its pages but the padding one; a draft window
    pool its token rows but the padding page (capped at an unaligned max_total_tokens with the
    radix cache off, it ends mid-page, as the target's does)."""
    if pool.name == "swa" and tensor is not None and tensor.views and pool.block_tokens:
        return tensor.views[0].shape[0] - pool.block_tokens * pool.padding_blocks
    return (pool.num_blocks - pool.padding_blocks) * (pool.block_tokens or 1)


def _v4_sizes(v4: SGLangDeepSeekV4) -> dict[str, int]:
    """DeepSeek-V4's pools report the sizes its configurator split the budget into."""
    return {
        "v4_swa": v4.swa_tokens, "v4_c4": v4.c4_tokens, "v4_c128": v4.c128_tokens,
        "v4_index_c4": v4.c4_index_tokens, "v4_state_c4": v4.c4_state_rows,
        "v4_index_state_c4": v4.c4_state_rows, "v4_state_c128": v4.c128_state_rows,
    }


def _v4_pool_tokens(v4: SGLangDeepSeekV4, pool: Pool) -> int:
    return _v4_sizes(v4).get(
        pool.name, (pool.num_blocks - pool.padding_blocks) * (pool.block_tokens or 1))


def _v4_empty_pools(plan: SGLangPlan) -> dict[str, dict[str, Any]]:
    """The pools a DeepSeek-V4 pipeline rank keeps without a buffer, each with the slots it
    was built for (deepseek_v4.empty_pools)."""
    v4 = plan.deepseek_v4
    if v4 is None:
        return {}
    sizes = _v4_sizes(v4)
    return {name: {"name": name, "location": "device", "tokens": sizes[name], "buffers": []}
            for name in v4.empty_pools}


def _layerless_kv_pool(plan: SGLangPlan) -> dict[str, dict[str, Any]]:
    """A pipeline rank of Mamba layers only: SGLang still builds its KV pool object, for the
    ranks' tokens, over no layer (no buffer); the plan has no pool for it."""
    if not mamba_only_rank(plan, {pool.name: pool for pool in plan.pools}):
        return {}
    return {"kv": {"name": "kv", "location": "device", "tokens": plan.max_total_num_tokens,
                   "buffers": []}}


def _empty_mamba_pools(plan: SGLangPlan) -> dict[str, dict[str, Any]]:
    """A pipeline rank keeping none of a Mamba hybrid's Mamba layers: SGLang's Mamba pool
    objects over no layer, each with its one zero-byte buffer."""
    empty = [] if plan.pipeline is None else plan.pipeline.empty_mamba_pools
    return {pool.name: {
        "name": pool.name, "location": "device", "tokens": pool.slots, "buffers": [{
            "layer": None, "name": pool.view.name, "dtype": pool.view.dtype,
            "shape": list(pool.view.shape), "strides": list(pool.view.strides),
            "storage_offset": pool.view.storage_offset, "storage_nbytes": 0,
            "storage": f"{pool.name}/0"}]} for pool in empty}


def _buffer(
    view: BufferView, layer: int | None, pool: Pool, storage: str
) -> dict[str, Any]:
    return {
        "layer": layer,
        "name": view.name,
        "dtype": view.dtype,
        "shape": list(view.shape),
        "strides": list(view.strides),
        "storage_offset": view.storage_offset,
        "storage_nbytes": pool.size,
        "storage": storage,
    }


def _sort_key(buffer: dict[str, Any]) -> tuple[int, str]:
    layer = buffer["layer"]
    return (-1 if layer is None else int(layer), str(buffer["name"]))


def _add_placeholders(plan: SGLangPlan, entry: dict[str, Any]) -> None:
    """The zero-row index_k buffers SGLang gives the layers sharing an earlier layer's index,
    each its own (empty) storage; the index storages then count in layer order, as SGLang's
    one list of per-layer buffers does."""
    width = plan.page_size * INDEX_ROW_BYTES
    offset = len(plan.tensors)
    for n, name in enumerate(plan.index_placeholder_layers):
        entry["buffers"].append({
            "layer": layer_id(name, offset + n), "name": "index_k", "dtype": "uint8",
            "shape": [0, width], "strides": [width, 1], "storage_offset": 0,
            "storage_nbytes": 0, "storage": "",
        })
    entry["buffers"].sort(key=_sort_key)
    for n, buffer in enumerate(entry["buffers"]):
        buffer["storage"] = f"index/{n}"


def _hisparse_metadata(plan: SGLangPlan) -> dict[str, Any]:
    """HiSparse's tensors beside the budget as the reference lists them (a DSA plan with
    HiSparse only: DeepSeek-V4's coordinator is not listed)."""
    if plan.hisparse is None or not plan.hisparse.metadata:
        return {}
    return {"hisparse_metadata": [buffer.model_dump(mode="json")
                                  for buffer in plan.hisparse.metadata]}


def report(plan: SGLangPlan) -> dict[str, Any]:
    """The plan as the reference report of one case: the budget figures, the request table,
    and every pool with its buffers. A per-layer pool gives each of its layers its own
    allocation (`storage` "<pool>/<n>", n counted in layer order, V after K where they are
    apart); a whole pool is one allocation whose buffers span its layers (`layer` null).

    The plan is checked first (`check_plan`); the other engine's plan is a PlanError."""
    plan = expect_plan(SGLangPlan, plan, "report")
    check_plan(plan)
    draft = {pool.name for pool in plan.pools if pool.name.startswith(DRAFT_PREFIX)}
    entries = _entries(plan, [pool for pool in plan.pools if pool.name not in draft])
    entries.update(_v4_empty_pools(plan))
    entries.update(_layerless_kv_pool(plan))
    entries.update(_empty_mamba_pools(plan))
    budget = plan.budget
    found = {
        **_hisparse_metadata(plan),
        "page_size": plan.page_size,
        "max_total_num_tokens": plan.max_total_num_tokens,
        "max_running_requests": plan.max_running_requests,
        # DeepSeek-V4's configurator keeps no cell size (its budget split is in deepseek_v4).
        "cell_size_bytes": None if plan.deepseek_v4 is not None else budget.cell_size_bytes,
        "available_bytes": budget.available_bytes,
        "req_to_token": {
            "shape": list(plan.req_to_token.shape), "dtype": plan.req_to_token.dtype,
        },
        "pools": [entries[name] for name in sorted(entries)],
    }
    if plan.speculative is not None:
        # The draft worker's pools, as its own pool objects name them.
        drafted = _entries(plan, [
            pool.model_copy(update={"name": pool.name.removeprefix(DRAFT_PREFIX)})
            for pool in plan.pools if pool.name in draft
        ], DRAFT_PREFIX)
        found["draft_pools"] = [drafted[name] for name in sorted(drafted)]
    return found


def _entries(plan: SGLangPlan, shown_pools: list[Pool], prefix: str = "") -> dict[str, Any]:
    """The report's entries of `shown_pools` (whose tensors name them `prefix` + name)."""
    pools = {pool.name: pool for pool in shown_pools}
    tensors = {tensor.pool.removeprefix(prefix): tensor for tensor in plan.tensors
               if tensor.pool.startswith(prefix)}
    entries: dict[str, dict[str, Any]] = {}
    storages: dict[str, int] = {}
    # K pools before their separate V pools, so V storages count on from K's.
    order = sorted(pools, key=lambda name: (name.removesuffix(SEPARATE_V_SUFFIX),
                                            name.endswith(SEPARATE_V_SUFFIX)))
    for name in order:
        pool = pools[name]
        tensor = tensors.get(name)
        shown = name
        if name.endswith(SEPARATE_V_SUFFIX) and name.removesuffix(SEPARATE_V_SUFFIX) in pools:
            shown = name.removesuffix(SEPARATE_V_SUFFIX)
        # A draft pool's pages but the padding one: the ids it is indexed by (with HiSparse
        # the allocator's logical ids, under decode context parallelism every rank's).
        tokens = _draft_tokens(pool, tensor) if prefix else _pool_tokens(plan, pool, tensor)
        entry = entries.setdefault(shown, {
            "name": shown, "location": pool.location, "tokens": tokens, "buffers": [],
        })
        if tensor is None:
            continue
        buffers = entry["buffers"]
        if pool.allocation == "whole":
            key = f"{shown}/{storages.get(shown, 0)}"
            storages[shown] = storages.get(shown, 0) + 1
            buffers.extend(_buffer(view, None, pool, key) for view in tensor.views)
            continue
        ids = sorted(layer_id(layer, i) for i, layer in enumerate(tensor.layers))
        first = storages.get(shown, 0)
        storages[shown] = first + len(ids)
        for n, layer in enumerate(ids):
            key = f"{shown}/{first + n}"
            buffers.extend(_buffer(view, layer, pool, key) for view in tensor.views)
    if plan.index_placeholder_layers and "index" in entries and not prefix:
        _add_placeholders(plan, entries["index"])
    for entry in entries.values():
        entry["buffers"].sort(key=_sort_key)
    return entries
