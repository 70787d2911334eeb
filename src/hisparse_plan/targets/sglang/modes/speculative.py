"""Speculative decoding as SGLang 0.5.23 sizes it (EAGLE family: NEXTN, EAGLE, EAGLE3), one
rule a function, for the resolve, size and place stages (resolve.py, size.py, place.py).

SGLang's draft worker is a second ModelRunner (`is_draft_worker=True`) whose pools are built
from the target's `memory_pool_config`, sharing the target's request-to-token table and token
allocator: its pools hold as many tokens as the target's full pool, with the draft's own layer
ids (0, 1, ...). The target's configurator pays for them in advance: the draft's layers join
the per-token cell size out of the same budget (`DefaultPoolConfigurator`,
`HybridSWAPoolConfigurator`), so the target's tokens shrink. The server hooks
(`arg_groups/speculative_hook.py`) turn NEXTN into EAGLE, default max_running_requests to 48
and pick steps, top-k and draft tokens; the request-to-token table widens by the draft tokens
(`allocation_sizing.get_req_to_token_extra_context_len`)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Final, Literal

from hisparse_plan.errors import UnsupportedRequestError
from hisparse_plan.models.sglang_settings import SGLangSettings
from hisparse_plan.targets.sglang.layout import Placed
from hisparse_plan.targets.sglang.model import INDEX_ROW_BYTES, HeadGroup, SGLangModel
from hisparse_plan.targets.sglang.modes.speculative_window import (
    draft_window_ids,
    refuse_unplanned_window_draft,
)
from hisparse_plan.targets.sglang.sizing import CellSize, element_size

SPECULATIVE_MAX_RUNNING_REQUESTS: Final = 48
"""`_handle_eagle_family`: max_running_requests when none is given."""
WIDE_TREE_ARCHITECTURES: Final = frozenset({
    "LlamaForCausalLM", "Grok1ForCausalLM", "Grok1VForCausalLM",
})
"""`_auto_choose_speculative_params`: architectures drafted 5 steps, top-4, 8 tokens."""
WIDE_TREE: Final = (5, 4, 8)
NARROW_CHAIN: Final = (3, 1, 4)
"""(num_steps, eagle_topk, num_draft_tokens) SGLang picks for every other architecture."""
DRAFT_PREFIX: Final = "draft_"
"""The draft worker's pools are named as the target's, with this prefix."""
DRAFT_LAYER: Final = "draft.layers.{}"
"""A draft layer's name: its id in the draft model (SGLang's draft layers count from 0)."""
REQ_TO_TOKEN_BASE: Final = 4
"""Columns SGLang's request-to-token table keeps beyond the context length without drafts."""


@dataclass(frozen=True, slots=True)
class Speculative:
    """The resolved speculative settings and the draft's layers."""

    algorithm: Literal["EAGLE", "EAGLE3"]
    num_steps: int
    eagle_topk: int
    num_draft_tokens: int
    draft_layers: int
    draft_window_layers: int
    draft_window_ids: tuple[int, ...] = ()
    """The draft's window layers by its own ids (a hybrid-window draft)."""

    @property
    def draft_full_layers(self) -> int:
        return self.draft_layers - self.draft_window_layers

    def layer_names(self) -> tuple[str, ...]:
        return tuple(DRAFT_LAYER.format(i) for i in range(self.draft_layers))

    def window_layer_names(self) -> tuple[str, ...]:
        return tuple(DRAFT_LAYER.format(i) for i in self.draft_window_ids)

    def full_layer_names(self) -> tuple[str, ...]:
        return tuple(DRAFT_LAYER.format(i) for i in range(self.draft_layers)
                     if i not in self.draft_window_ids)


def _refuse(field: str, why: str) -> UnsupportedRequestError:
    return UnsupportedRequestError(f"engine.{field}: {why}", field=f"engine.{field}")


def refuse_without_algorithm(settings: SGLangSettings) -> None:
    """Draft settings without an algorithm plan nothing SGLang runs (its table would still
    widen by the draft tokens): refused naming the first one given."""
    if settings.speculative_algorithm is not None:
        return
    for field in ("speculative_num_draft_tokens", "speculative_num_steps",
                  "speculative_eagle_topk", "speculative_draft_num_layers",
                  "speculative_draft_window_layer_ids"):
        if getattr(settings, field) is not None:
            raise _refuse(field, "speculative decoding settings need a speculative_algorithm; "
                          f"expected null, or engine.speculative_algorithm set, got "
                          f"{getattr(settings, field)}")


def refuse_unplanned_speculative(settings: SGLangSettings, model: SGLangModel) -> None:
    """Speculative decoding beside what its rules here do not plan: a draft with window
    layers beside a target SGLang cannot size its pools from (speculative_window.py)."""
    refuse_unplanned_window_draft(settings, model)


def resolve_speculative(settings: SGLangSettings) -> Speculative | None:
    """SGLang's resolution (`handle_speculative_decoding`, `_handle_eagle_family`): NEXTN is
    EAGLE; without num_steps SGLang picks (steps, top-k, tokens) by the architecture and
    requires the other two unset; with top-k 1 the draft tokens are steps + 1. The draft's
    layers must be given."""
    algorithm = settings.speculative_algorithm
    if algorithm is None:
        return None
    layers = settings.speculative_draft_num_layers
    if layers is None:
        raise _refuse("speculative_draft_num_layers", (
            f"{algorithm} needs the draft's KV layers (NEXTN: the model's "
            "num_nextn_predict_layers; EAGLE: the draft config's); expected a count, got null"))
    if settings.speculative_draft_window_layers > layers:
        raise _refuse("speculative_draft_window_layers", (
            f"expected at most speculative_draft_num_layers {layers}, got "
            f"{settings.speculative_draft_window_layers}"))
    steps, topk, tokens = _auto_params(settings)
    if topk == 1 and tokens != steps + 1:
        tokens = steps + 1
    return Speculative("EAGLE3" if algorithm == "EAGLE3" else "EAGLE", steps, topk, tokens,
                       layers, settings.speculative_draft_window_layers,
                       draft_window_ids(settings, layers))


def tree_keeps_unpaged(settings: SGLangSettings, model: SGLangModel) -> bool:
    """A draft tree (top-k above 1) on an MHA model leaves SM100 on a backend that takes any
    page (triton), so Blackwell's trtllm page is not forced (blackwell_page)."""
    spec = resolve_speculative(settings)
    return spec is not None and spec.eagle_topk > 1 and model.latent is None


def refuse_tree_on_paged_backend(
    spec: Speculative | None, page_size: int, model: SGLangModel, blackwell_mla: bool
) -> None:
    """Top-k above 1 with pages above a token runs only on SGLang's flashinfer, fa3 and triton
    attention backends: a DSA model's (dsa) and, on SM100, a DeepSeek-family MLA model's
    (trtllm_mla) refuse it."""
    if spec is None or spec.eagle_topk == 1 or page_size == 1:
        return
    dsa = model.latent is not None and model.latent.is_dsa
    if dsa or blackwell_mla:
        backend = "dsa" if dsa else "trtllm_mla"
        raise _refuse("speculative_eagle_topk", (
            f"SGLang takes top-k above 1 with pages of {page_size} tokens only on its "
            f"flashinfer, fa3 and triton attention backends, not {backend}; expected 1, got "
            f"{spec.eagle_topk}"))


def _auto_params(settings: SGLangSettings) -> tuple[int, int, int]:
    """(steps, top-k, draft tokens): given, or SGLang's choice when num_steps is not given
    (and then neither of the others may be: SGLang asserts it)."""
    steps = settings.speculative_num_steps
    if steps is not None:
        topk = settings.speculative_eagle_topk
        tokens = settings.speculative_num_draft_tokens
        if topk is None or tokens is None:
            missing = "speculative_eagle_topk" if topk is None else "speculative_num_draft_tokens"
            raise _refuse(missing, "SGLang reads it beside a given speculative_num_steps; "
                          "expected a count, got null")
        return steps, topk, tokens
    for field in ("speculative_eagle_topk", "speculative_num_draft_tokens"):
        if getattr(settings, field) is not None:
            raise _refuse(field, "SGLang picks it with speculative_num_steps (and asserts it "
                          "unset when the steps are); expected null or speculative_num_steps "
                          f"given, got {getattr(settings, field)}")
    return WIDE_TREE if settings.architecture in WIDE_TREE_ARCHITECTURES else NARROW_CHAIN


def speculative_requests(settings: SGLangSettings, spec: Speculative | None) -> SGLangSettings:
    """The settings sizing reads: with speculative decoding, max_running_requests 48 when none
    is given (the server's count, shared by attention DP groups as a given one is)."""
    if spec is None or settings.max_running_requests is not None:
        return settings
    return settings.model_copy(update={"max_running_requests": SPECULATIVE_MAX_RUNNING_REQUESTS})


def draft_layer_bytes(
    model: SGLangModel, row_bytes: int, dtypes: tuple[str | None, str | None]
) -> int:
    """Bytes one draft layer takes a token, at the TARGET's per-layer geometry (SGLang's
    configurators assume the draft shares it): a latent row and, for a DSA model, an index key
    (every draft layer runs its indexer); else one full-attention layer's K and V: on a
    pipeline rank of window layers only, the model's full layers' shape, which the read stage
    found equal to its window layers' (window_only.refuse_unlike_full_shape). `dtypes`: the
    full and window pools' cache dtypes."""
    if model.latent is not None:
        return row_bytes + (INDEX_ROW_BYTES if model.latent.is_dsa else 0)
    full, dtype = (model.full, dtypes[0]) if model.full is not None else (model.swa, dtypes[1])
    if full is None or dtype is None:  # read_model refuses a model without attention
        return 0
    return full.heads * (full.head_dim + full.v_head_dim) * element_size(dtype)


def draft_token_scale(settings: SGLangSettings) -> int:
    """Draft rows a target token pays for: with HiSparse the draft pool is indexed by the
    allocator's logical (host-wide) ids, host_to_device_ratio of them a device token; under
    decode context parallelism the replicated draft takes every rank's ids, dcp_size of them
    (SGLang refuses the two together)."""
    if settings.enable_hisparse:
        return settings.hisparse_host_to_device_ratio
    return settings.dcp_size


def draft_tokens(tokens: int, logical_tokens: int | None, page_size: int) -> int:
    """The draft pool's tokens: the target's, or with HiSparse its allocator's logical ids,
    rounded up to a page (`_init_pools`' draft_virtual_id_space)."""
    if logical_tokens is None:
        return tokens
    return -(-logical_tokens // page_size) * page_size


def window_layer_bytes(model: SGLangModel, swa_dtype: str | None) -> int:
    """Bytes one window layer takes a window token (the draft's window layers', too)."""
    swa = model.swa
    if swa is None or swa_dtype is None:
        return 0
    return swa.heads * (swa.head_dim + swa.v_head_dim) * element_size(swa_dtype)


def with_draft(
    cell: CellSize, spec: Speculative | None, full_layer: int, window_layer: int, ratio: float
) -> tuple[CellSize, int]:
    """The target's cell with the draft's layers in it, and the bytes they add a full token:
    its full layers to the full part, its window layers to the window part (counted at
    swa_full_tokens_ratio), the total summed as SGLang sums it."""
    if spec is None:
        return cell, 0
    full = cell.full + full_layer * spec.draft_full_layers
    swa = cell.swa + window_layer * spec.draft_window_layers
    if isinstance(cell.total, int) and swa == 0:
        return CellSize(full, 0, full), full - cell.full
    if cell.window_only:
        return CellSize(full, swa, full + swa, window_only=True), full - cell.full
    total = full + ratio * swa
    return CellSize(full, swa, total), full - cell.full


def req_to_token_extra(spec: Speculative | None, alloc_page: int) -> int:
    """Columns beyond the context length: 4 plus the draft tokens; with pages above one token,
    at least the double-buffered decode allocation (2 x max(steps x top-k, draft tokens)) and
    a page less one (decode_allocation)."""
    if spec is None:
        return REQ_TO_TOKEN_BASE
    extra = REQ_TO_TOKEN_BASE + spec.num_draft_tokens
    if alloc_page > 1:
        extra = max(extra, 2 * decode_allocation(spec, alloc_page) + alloc_page - 1)
    return extra


def swa_cap_terms(spec: Speculative | None, alloc_page: int, *, overlap: bool = True
                  ) -> tuple[int, int | None]:
    """What speculative decoding adds to a request's window-pool cap (radix cache off): an
    eviction interval a draft token, and a decode step's allocation: twice over where the
    overlap scheduler keeps two outstanding, else (pipeline stages turn it off) one step as
    the non-overlap decode allocates it; without speculative decoding one interval and a
    page."""
    if spec is None:
        return 1, None
    if not overlap:
        return spec.num_draft_tokens, serial_decode_allocation(spec, alloc_page)
    return spec.num_draft_tokens, 2 * decode_allocation(spec, alloc_page)


def serial_decode_allocation(spec: Speculative, page: int) -> int:
    """Tokens a request allocates in a decode step without the overlap scheduler
    (spec_decode_alloc_len_per_request): steps x top-k, each branch rounded up to whole pages
    (a tree's branch also a page more for its last partial page), or the draft tokens rounded
    up to pages, the larger."""
    steps, tokens = spec.num_steps, spec.num_draft_tokens
    if page > 1:
        steps = -(-(steps + (page if spec.eagle_topk > 1 else 0)) // page) * page
        tokens = -(-tokens // page) * page
    return max(steps * spec.eagle_topk, tokens)


def decode_allocation(spec: Speculative, alloc_page: int) -> int:
    """Tokens one request may allocate in a decode step (`get_alloc_len_per_decode`): the
    draft tokens or steps x top-k, the larger; a tree (top-k above 1) on pages above a token
    takes, per branch, the pages its steps can straddle."""
    if alloc_page == 1 or spec.eagle_topk == 1:
        return max(spec.num_steps * spec.eagle_topk, spec.num_draft_tokens)
    pages = (alloc_page - 1 + spec.num_steps + alloc_page - 1) // alloc_page
    return max(pages * alloc_page * spec.eagle_topk, spec.num_draft_tokens)


def draft_head_group(
    settings: SGLangSettings, model: SGLangModel, spec: Speculative
) -> HeadGroup | None:
    """An MHA draft's layers as one pool: the draft's heads and head_dim (the target's full
    attention shape when not given)."""
    full = model.full
    if full is None:
        return None
    heads = settings.speculative_draft_kv_heads or full.heads
    dim = settings.speculative_draft_head_dim
    head_dim, v_head_dim = (full.head_dim, full.v_head_dim) if dim is None else (dim, dim)
    return replace(full, names=spec.layer_names(), heads=heads, head_dim=head_dim,
                   v_head_dim=v_head_dim, window=None)


def as_draft(placed: Placed) -> Placed:
    """The draft worker's pools, named apart from the target's (`draft_kv`, `draft_index`)."""
    pools = tuple(pool.model_copy(update={"name": DRAFT_PREFIX + pool.name})
                  for pool in placed.pools)
    tensors = tuple(tensor.model_copy(update={"pool": DRAFT_PREFIX + tensor.pool})
                    for tensor in placed.tensors)
    return Placed(pools, tensors)
