"""Stage 1, read the model: the request's SGLang settings (settings.py) and its layers sorted
into the pools SGLang keeps (model.py; DeepSeek-V4's caches into its own pools,
deepseek_v4/model.py). Hands the next stage a `Read`, or a `ReadV4` for DeepSeek-V4, whose rules
differ at every stage after this one."""

from __future__ import annotations

from dataclasses import dataclass, replace

from hisparse_plan.models.request import PlanRequest
from hisparse_plan.models.sglang_settings import SGLangSettings
from hisparse_plan.targets.sglang.deepseek_v4.model import V4Model, is_deepseek_v4, read_v4_model
from hisparse_plan.targets.sglang.deepseek_v4.pipeline_stages import (
    model_ratios,
    refuse_hisparse_without_c4,
)
from hisparse_plan.targets.sglang.model import SGLangModel, read_model
from hisparse_plan.targets.sglang.modes.draft_context import refuse_shorter_draft_context
from hisparse_plan.targets.sglang.modes.pipeline_stages import (
    Stage,
    has_full_attention,
    has_window_layers,
    rank_mamba_group,
    refuse_draft_states_without_mamba,
    stage_of,
    stage_request,
)
from hisparse_plan.targets.sglang.modes.speculative import refuse_without_algorithm
from hisparse_plan.targets.sglang.modes.window_only import (
    refuse_full_only_rank,
    refuse_unlike_full_shape,
)
from hisparse_plan.targets.sglang.served.architectures import (
    refuse_longer_context,
    refuse_unserved_architecture,
    windows_in_full_pool,
)
from hisparse_plan.targets.sglang.served.llama4 import is_llama4_hybrid, read_llama4_model
from hisparse_plan.targets.sglang.settings import (
    refuse_v4_settings,
    refuse_vllm_sections,
    sglang_settings,
)
from hisparse_plan.targets.trace import Trace

STAGE = "read"
RULE = "sglang.pools"


@dataclass(frozen=True, slots=True)
class Read:
    """The settings and the model, its layers by SGLang pool."""

    settings: SGLangSettings
    model: SGLangModel
    available_bytes: int
    """device.available_bytes: the KV budget when the free-memory figures are not given."""
    index_topk: int | None = None
    """The model's index_topk (model.index_topk), the top-k SGLang's HiSparse runs."""
    stage: Stage | None = None
    """The pipeline rank's stage (`model` holds its layers only); None with one stage."""


@dataclass(frozen=True, slots=True)
class ReadV4:
    """The settings and a DeepSeek-V4 model, its caches by SGLang V4 pool."""

    settings: SGLangSettings
    model: V4Model
    available_bytes: int
    index_topk: int | None = None
    """The model's index_topk, the top-k SGLang's HiSparse runs."""
    stage: Stage | None = None
    """The pipeline rank's stage (`model` holds its layers' caches only); None with one
    stage."""
    model_ratios: frozenset[int] = frozenset()
    """The compression ratios of the whole model, every rank's (SGLang keeps a pool for each
    on every rank)."""


def read(
    request: PlanRequest, trace: Trace, peer_tokens: tuple[int, ...] | None = None
) -> Read | ReadV4:
    """The settings first (a vLLM request, and vLLM-only sections, are refused before any
    layer is read), then the layers: DeepSeek-V4's caches by its own reader, after the settings
    its path does not take are refused; with pipeline stages, the rank's layers only
    (`peer_tokens`: every rank's own tokens, once known), DeepSeek-V4's too."""
    settings = sglang_settings(request)
    refuse_without_algorithm(settings)
    refuse_vllm_sections(request)
    refuse_unserved_architecture(settings)
    refuse_longer_context(settings)
    refuse_shorter_draft_context(settings)
    available = request.device.available_bytes
    v4_request = is_deepseek_v4(request)
    if v4_request:
        refuse_v4_settings(settings)
    stage = stage_of(request, settings)
    if stage is not None and peer_tokens is not None:
        stage = replace(stage, peer_tokens=peer_tokens)
    staged = stage_request(request, stage)
    if v4_request:
        v4 = read_v4_model(staged)
        refuse_hisparse_without_c4(settings, v4, stage)
        if trace.enabled:
            if stage is not None:
                _trace_stage(stage, trace)
            _trace_v4(v4, trace)
        return ReadV4(settings, v4, available, request.model.index_topk, stage,
                      model_ratios(request))
    llama4 = is_llama4_hybrid(request, settings)
    if llama4:
        model = read_llama4_model(request, settings, kept=staged.layers.keys())
    else:
        model = read_model(staged, windows_as_full=windows_in_full_pool(settings),
                           stage_of_hybrid=stage is not None and has_full_attention(request))
        model = replace(model, mamba=rank_mamba_group(request, stage, model.mamba))
        refuse_draft_states_without_mamba(settings, stage, model.mamba)
    refuse_full_only_rank(model, stage, hybrid=llama4 or (
        has_window_layers(request) and not windows_in_full_pool(settings)))
    refuse_unlike_full_shape(request, model, settings)
    if trace.enabled:
        if stage is not None:
            _trace_stage(stage, trace)
        _trace_model(model, trace)
        if llama4 and model.swa is not None:
            trace.add(STAGE, RULE, "swa: Llama-4 window layers", len(model.swa.names),
                      "SGLang's get_hybrid_layer_ids for Llama4ForConditionalGeneration: "
                      "every layer but each 4th (by position, not no_rope_layers), window "
                      f"{model.swa.window} (sliding_window, else attention_chunk_size)"
                      if settings.architecture is not None else
                      "chunked-local layers of a model of unknown architecture")
        if windows_in_full_pool(settings) and any(
                spec.kind in ("sliding_window", "chunked_local_attention")
                for spec in request.layers.values()):
            trace.add(STAGE, RULE, "kv: sliding-window layers served as full attention",
                      settings.architecture,
                      "not one of SGLang's hybrid-window architectures (is_hybrid_swa_model): "
                      "one full pool holds every token of every layer")
    return Read(settings, model, available, request.model.index_topk, stage)


def _trace_stage(stage: Stage, trace: Trace) -> None:
    trace.add(STAGE, "sglang.pipeline", f"pipeline rank {stage.rank} of {stage.size}",
              f"layers [{stage.start}, {stage.end})",
              f"get_pp_indices: {stage.num_layers} decoder layers, "
              f"{stage.num_layers // stage.size} a rank, the last "
              f"{stage.num_layers % stage.size} ranks one more")


def _trace_model(model: SGLangModel, trace: Trace) -> None:
    for pool, group, what in (("kv", model.full, "full_attention"),
                              ("swa", model.swa, "sliding_window")):
        if group is None:
            continue
        window = "" if group.window is None else f", window {group.window}"
        trace.add(STAGE, RULE, f"{pool}: {what} layers", len(group.names),
                  f"from {group.names[0]!r}: {group.heads} kv heads x head_size "
                  f"{group.head_dim} (V {group.v_head_dim}), {group.dtype}{window}")
    latent = model.latent
    if latent is not None:
        trace.add(STAGE, RULE, "kv: mla layers", len(latent.names),
                  f"from {latent.names[0]!r}: one latent row of {latent.latent_dim} elements "
                  f"(kv_lora_rank {latent.kv_lora_rank} + rope), {latent.dtype}")
        if latent.is_dsa:
            trace.add(STAGE, RULE, "index: indexer layers", len(latent.index_names),
                      f"from {latent.index_names[0]!r}: a DSA model's index keys, one per "
                      "latent layer")
    if model.mamba is not None:
        mamba = model.mamba
        first = (f"from {mamba.names[0]!r}" if mamba.names else
                 "none on this pipeline rank, the whole model's states over no layer")
        trace.add(STAGE, RULE, "mamba: mamba layers", len(mamba.names),
                  f"{first}: conv state {list(mamba.conv_shape)} (dim first, as "
                  f"SGLang stores it), temporal state {list(mamba.temporal_shape)}")


def _trace_v4(model: V4Model, trace: Trace) -> None:
    trace.add(STAGE, RULE, "v4_swa: window caches", len(model.swa),
              f"DeepSeek-V4: one sliding-window cache per decoder layer, window {model.window}")
    for ratio, layers in model.compressed.items():
        trace.add(STAGE, RULE, f"v4_c{ratio}: compressed caches", len(layers),
                  f"layers compressing {ratio} tokens into one row, from {layers[0]!r}")
    if model.index_keys:
        trace.add(STAGE, RULE, "v4_index_c4: indexer key caches", len(model.index_keys),
                  f"one per ratio-4 layer, index_head_dim {model.index_head_dim}")
    states = {f"v4_state_c{ratio}": layers for ratio, layers in model.states.items()}
    if model.index_states:
        states["v4_index_state_c4"] = model.index_states
    for name, layers in states.items():
        trace.add(STAGE, RULE, f"{name}: compressor states", len(layers),
                  f"rows of {model.state_widths[name]} float32 values (kv, then score)")
