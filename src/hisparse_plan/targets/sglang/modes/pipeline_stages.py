"""SGLang 0.5.23's pipeline parallelism (`--pp-size N`), one rule a function: each of N ranks
is its own process that builds the decoder layers `get_pp_indices` gives it
(srt/distributed/utils.py) and sizes its own pools for them; the ranks then agree on the
fewest tokens any of them holds (`KVCacheConfigurator._apply_token_constraints`: a MIN
all-reduce); a Mamba hybrid charges every rank the largest stage's share of its states
(`_handle_max_mamba_cache`), and the default fraction keeps tp x pp / 8 GiB back with the prefill
graphs off (memory_hook, cuda_graph_hook).

A plan is one rank's (`engine.pp_rank`), as each rank's process allocates only its own pools;
the read stage keeps that rank's layers (`stage_request`), the size stage takes the fewest of
every rank's tokens (`agreed_tokens`, the ranks planned on their own by `pipeline.py`)."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Final

from hisparse_plan.errors import PlanError, UnsupportedRequestError
from hisparse_plan.models.base import INT64_MAX
from hisparse_plan.models.layer_specs import (
    FullAttentionSpec,
    MambaSpec,
    SlidingWindowSpec,
)
from hisparse_plan.models.request import PlanRequest
from hisparse_plan.models.sglang_settings import SGLangSettings
from hisparse_plan.targets.sglang.model import MambaGroup, mamba_group

LAYER_INDEX: Final = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")
"""A request layer's decoder layer: the number after `layers.` (an indexer's keys and its
latent layer share it)."""
UNSPLIT_ARCHITECTURES: Final[dict[str, str]] = {
    "Qwen3NextForCausalLM": "its model class asserts one pipeline rank (qwen3_next.py: "
    "`assert self.pp_group.is_first_rank and self.pp_group.is_last_rank`)",
    "Gemma2ForCausalLM": "its model class builds every layer on every rank (make_layers "
    "without a pipeline rank), so no rank holds a stage",
    "Gemma3ForCausalLM": "its model class builds every layer on every rank (make_layers "
    "without a pipeline rank), so no rank holds a stage",
    "Gemma3ForConditionalGeneration": "its language model builds every layer on every rank "
    "(make_layers without a pipeline rank), so no rank holds a stage",
}
"""Architectures whose SGLang model class does not split its layers over pipeline ranks."""


@dataclass(frozen=True, slots=True)
class Stage:
    """One pipeline rank: its layers [start, end) of `num_layers`, and the Mamba share."""

    rank: int
    size: int
    num_layers: int
    start: int
    end: int
    mamba_layers: int
    """Mamba layers of the whole model (0 without)."""
    mamba_stage_layers: int
    """The most Mamba layers any rank keeps."""
    peer_tokens: tuple[int, ...] | None = None
    """Every rank's own token capacity, once each was planned on its own (None until then)."""


def pp_indices(num_layers: int, rank: int, size: int) -> tuple[int, int]:
    """SGLang's get_pp_indices: num_layers // size layers a rank, the last num_layers % size
    ranks one more; the rank's [start, end)."""
    base, extra = divmod(num_layers, size)
    if rank >= size - extra:
        start = rank * (base + 1) - (size - extra)
        return start, start + base + 1
    return rank * base, rank * base + base


def layer_index(name: str) -> int:
    """The decoder layer a request layer belongs to; a name without `layers.N` is refused (a
    pipeline splits the model by decoder layer)."""
    match = LAYER_INDEX.search(name)
    if match is None or len(match.group(1)) > 9:
        raise UnsupportedRequestError(
            f"layers[{name!r}]: SGLang splits a pipeline by decoder layer; expected a name with "
            "`layers.N` (N the layer's index) with engine.pp_size > 1",
            field=f"layers[{name!r}]",
        )
    return int(match.group(1))


def refuse_unsplit(settings: SGLangSettings) -> None:
    """A model SGLang's class does not split over pipeline ranks (every rank would hold every
    layer, or the class refuses) is refused with pp_size > 1, naming why."""
    why = UNSPLIT_ARCHITECTURES.get(settings.architecture or "")
    if settings.pp_size > 1 and why is not None:
        raise UnsupportedRequestError(
            f"engine.pp_size: SGLang does not run {settings.architecture} in pipeline stages: "
            f"{why}; expected 1, got {settings.pp_size}",
            field="engine.pp_size",
        )


def hosts_draft_worker(stage: Stage | None) -> bool:
    """Whether the rank runs speculative decoding's draft worker: the only rank, or the last
    pipeline rank (SGLang's EAGLEWorkerV2 builds it where pp_group.is_last_rank)."""
    return stage is None or stage.rank == stage.size - 1


def has_full_attention(request: PlanRequest) -> bool:
    """The whole model has a full-attention layer: a rank of its window layers only is then
    SGLang's all-window pool (window_only.py), not a window-only model."""
    return any(isinstance(spec, FullAttentionSpec) for spec in request.layers.values())


def has_window_layers(request: PlanRequest) -> bool:
    """The whole model has a sliding-window layer (a window hybrid, where SGLang serves one)."""
    return any(isinstance(spec, SlidingWindowSpec) for spec in request.layers.values())


def stage_of(request: PlanRequest, settings: SGLangSettings) -> Stage | None:
    """The rank's stage (None with one stage): the model's decoder layers are the distinct
    `layers.N` of the request, which SGLang needs at least pp_size of (make_layers)."""
    if settings.pp_size == 1:
        return None
    refuse_unsplit(settings)
    indices = {name: layer_index(name) for name in request.layers}
    num_layers = max(indices.values()) + 1
    if num_layers < settings.pp_size:
        raise PlanError(
            f"engine.pp_size: SGLang gives every pipeline rank at least one decoder layer; "
            f"expected at most the model's {num_layers} layers, got {settings.pp_size}",
            field="engine.pp_size",
        )
    mamba = [index for name, index in indices.items()
             if isinstance(request.layers[name], MambaSpec)]
    start, end = pp_indices(num_layers, settings.pp_rank, settings.pp_size)
    return Stage(settings.pp_rank, settings.pp_size, num_layers, start, end, len(mamba),
                 mamba_stage_layers(mamba, num_layers, settings.pp_size))


def mamba_stage_layers(mamba: list[int], num_layers: int, size: int) -> int:
    """The most Mamba layers any rank keeps (0 without Mamba layers)."""
    ranges = [pp_indices(num_layers, rank, size) for rank in range(size)]
    return max((sum(start <= i < end for i in mamba) for start, end in ranges), default=0)


def stage_request(request: PlanRequest, stage: Stage | None) -> PlanRequest:
    """The request with only the rank's layers (model order kept): what its pools hold."""
    if stage is None:
        return request
    layers = {name: spec for name, spec in request.layers.items()
              if stage.start <= layer_index(name) < stage.end}
    if not layers:
        raise PlanError(
            f"engine.pp_rank: rank {stage.rank} keeps decoder layers [{stage.start}, "
            f"{stage.end}), of which the request has none; expected layers there",
            field="engine.pp_rank",
        )
    return request.model_copy(update={"layers": layers})


def rank_mamba_group(
    request: PlanRequest, stage: Stage | None, own: MambaGroup | None
) -> MambaGroup | None:
    """The Mamba group a rank sizes and builds its state pools by: its own layers'; on a rank
    of a Mamba hybrid that keeps none of them, the whole model's states over no layer
    (SGLang's rank reads the whole model's mambaish_config, charges the largest stage's slots
    in _handle_max_mamba_cache, and builds its MambaPool over its empty [start, end) slice of
    the Mamba layers)."""
    if stage is None or own is not None or not stage.mamba_layers:
        return own
    names = [name for name, spec in request.layers.items() if isinstance(spec, MambaSpec)]
    specs: list[MambaSpec] = [spec for spec in request.layers.values()
                              if isinstance(spec, MambaSpec)]
    return replace(mamba_group(names, specs), names=())


def refuse_draft_states_without_mamba(
    settings: SGLangSettings, stage: Stage | None, group: MambaGroup | None
) -> None:
    """Speculative decoding on a rank keeping none of a Mamba hybrid's Mamba layers: SGLang's
    MambaPool there also keeps the draft tokens' intermediate states over no layer, which the
    plan does not record (its empty pools are the conv and temporal states only): refused,
    a planner limit, rather than planned without them."""
    if stage is None or group is None or group.names or settings.speculative_algorithm is None:
        return
    raise UnsupportedRequestError(
        f"engine.speculative_algorithm: pipeline rank {stage.rank} of {stage.size} keeps none "
        f"of the model's {stage.mamba_layers} Mamba layers; with speculative decoding SGLang "
        "keeps intermediate Mamba states over no layer there, which this planner does not "
        "describe; expected no speculative decoding, or a split where every rank keeps a "
        "Mamba layer",
        field="engine.speculative_algorithm",
    )


def zero_cell_tokens(page_size: int) -> int:
    """The tokens a rank without a KV layer (Mamba layers only) offers the ranks' MIN:
    int64's largest count, floored to a page (DefaultPoolConfigurator's _zero_kv_max_tokens
    where another stage keeps the KV layers), so the other ranks' counts decide."""
    return INT64_MAX // page_size * page_size


def stage_slot_bytes(layer_bytes: int, stage: Stage | None, rank_mamba_layers: int) -> int:
    """A Mamba state slot's bytes as every rank charges them, from one layer's (`layer_bytes`):
    the whole model's slot (SGLang's mamba_cache_per_req) times the largest stage's share of
    its Mamba layers, int() of the float product, as SGLang computes it (a rank keeping none
    of them too); the rank's own layers' without stages."""
    if stage is None or stage.mamba_layers == 0:
        return layer_bytes * rank_mamba_layers
    whole = layer_bytes * stage.mamba_layers
    return int(whole * (stage.mamba_stage_layers / stage.mamba_layers))


def agreed_tokens(tokens: int, stage: Stage | None) -> int:
    """The tokens every rank's pools take: the fewest any rank holds (SGLang's MIN
    all-reduce of the ranks' capacities); the rank's own without stages, or before the ranks
    were planned."""
    if stage is None or stage.peer_tokens is None:
        return tokens
    return min(tokens, *stage.peer_tokens)


def prefill_graphs_by_default(settings: SGLangSettings) -> bool:
    """SGLang turns its default (breakable) prefill graphs off with pipeline stages
    (cuda_graph_hook.apply_cuda_graph_compatibility: opt-in only), so its default fraction
    keeps nothing back for them."""
    return settings.pp_size == 1


def overlap_schedule(settings: SGLangSettings) -> bool:
    """SGLang's overlap scheduler is on unless `--disable-overlap-schedule` is given or
    pipeline stages turn it off (overrides._pipeline_parallel_overlap_disable): a Mamba
    request then keeps one tracking slot, not two, and a window pool one prefill chunk in
    flight, not two."""
    return settings.pp_size == 1 and not settings.disable_overlap_schedule
