"""`check_plan` for what SGLang's server modes state in a plan beyond their own sections
(docs/plan-contract.md#sglang-plans), from the plan alone: which latent layer each index
buffer or zero-row placeholder stands for (shared-index DSA models), where a window pool sized
for the running requests (the radix cache off) can be, and which draft trees a DSA model's
pages can run."""

from __future__ import annotations

import re
from collections import Counter
from typing import Final

from hisparse_plan.errors import PlanInvariantError
from hisparse_plan.models.pools import Pool
from hisparse_plan.models.sglang_plan import SGLangPlan

LAYER_ID: Final = re.compile(r"(?:^|\.)layers\.(\d{1,18})(?:\.|$)")
ANY_NUMBER: Final = re.compile(r"\d{1,18}")


def check_modes(plan: SGLangPlan, pools: dict[str, Pool]) -> None:
    """Raise `PlanInvariantError` at the first broken invariant of the rules below."""
    _check_index_sharing(plan)
    _check_request_sized_window(plan, pools)
    _check_dsa_draft_tree(plan, pools)


def _layer_id(name: str) -> int | None:
    """SGLang's layer id of a layer name, as the SGLang adapter gives each buffer one
    (adapters/sglang/report.layer_id): the number after `layers.`, else the first number;
    None for a name without one (the adapter would fall back to its place in a list, which
    pairs no index buffer with a latent layer)."""
    found = LAYER_ID.search(name)
    if found is not None:
        return int(found.group(1))
    found = ANY_NUMBER.search(name)
    return None if found is None else int(found.group(0))


def _check_index_sharing(plan: SGLangPlan) -> None:
    """With placeholders, SGLang's index buffer of layer id K is either the index pool's layer
    K or a placeholder: so every latent layer, index layer and placeholder has a layer id, and
    the index layers and placeholders together have each latent layer's id once (a count
    alone would let one layer have two and another none). Names without any id (a request's
    own names) leave the pairing to the count (sglang.py's _check_index_placeholders)."""
    if not plan.index_placeholder_layers:
        return
    named = [*(layer for t in plan.tensors if t.pool == "index" for layer in t.layers),
             *plan.index_placeholder_layers]
    latent = [layer for t in plan.tensors if t.pool == "kv" for layer in t.layers]
    ids = [_layer_id(layer) for layer in (*named, *latent)]
    if all(found is None for found in ids):
        return  # names of no layer id (a hand-written request): paired by count alone
    for layer, found in zip((*named, *latent), ids, strict=True):
        if found is None:
            raise PlanInvariantError(
                f"layer {layer!r} has no layer id (layers.K, or a number) beside layers that "
                "have one; expected every latent layer, index layer and index placeholder to "
                "have one, so that each latent layer's index buffer is known", layer=layer)
    have = Counter(_layer_id(layer) for layer in named)
    want = Counter(_layer_id(layer) for layer in latent)
    if have != want:
        odd = sorted(k for k in (have | want) if have[k] != want[k] and k is not None)[0]
        raise PlanInvariantError(
            f"layer id {odd} has {have[odd]} index buffers (index pool layers and "
            f"index_placeholder_layers) and {want[odd]} latent layers; expected one index "
            "buffer, real or a placeholder, for each latent layer")


def _check_request_sized_window(plan: SGLangPlan, pools: dict[str, Pool]) -> None:
    """SGLang sizes a window pool for the running requests only beside a full pool (the full
    pool takes the rest of the budget); a rank of window layers only is its all-window pool,
    max_total_num_tokens long, with no request cap."""
    if plan.budget.swa_sized_for_requests and "kv" not in pools:
        raise PlanInvariantError(
            "budget.swa_sized_for_requests is true in a plan without a full pool 'kv'; "
            "expected false: a window pool is sized for the running requests only beside a "
            "full pool (a rank of window layers only holds max_total_num_tokens)")


def _check_dsa_draft_tree(plan: SGLangPlan, pools: dict[str, Pool]) -> None:
    """A draft tree (top-k above 1) on pages above a token runs only on SGLang's flashinfer,
    fa3 and triton backends; a DSA model (index keys) runs its dsa backend, which SGLang's
    speculative hook refuses it on (docs/planning-rules.md#sglang-speculative-decoding)."""
    spec = plan.speculative
    if spec is not None and spec.eagle_topk > 1 and plan.page_size > 1 and "index" in pools:
        raise PlanInvariantError(
            f"speculative.eagle_topk is {spec.eagle_topk} in a DSA plan (an index pool) of "
            f"{plan.page_size}-token pages; expected 1: SGLang runs a draft tree on pages "
            "only on its flashinfer, fa3 and triton backends, not dsa")
