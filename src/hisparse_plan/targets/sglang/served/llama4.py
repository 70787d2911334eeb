"""Llama-4's chunked-local layers as SGLang 0.5.23 pools them (read stage).

SGLang lists `Llama4ForConditionalGeneration` among its window hybrids (`is_hybrid_swa_model`,
configs/model_config.py) and lays the layers out by position alone (`get_hybrid_layer_ids`):
layer i is a window layer when (i + 1) % 4 != 0, else a full one, whatever the config's
`no_rope_layers` or `attention_chunk_size` say (its model code, models/llama4.py, decides RoPE
by the same rule). The window pool's window is `sliding_window_size` as
`resolve_sliding_window_size` (load_model_utils.py) finds it: the text config's
`sliding_window` where one is set, else `attention_chunk_size`, else none (no model hook; the
window then only sizes nothing: no per-request cap, no admission floor). The window pool is
sized as any of SGLang's hybrid window pools (HybridSWAPoolConfigurator: full + ratio x window
bytes a token). `Llama4ForCausalLM` is not a window hybrid: its chunked layers join the one
full pool (served.windows_in_full_pool). An unknown architecture (a preset) keeps the request's
own kinds: chunked layers in the window pool.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, Final

from hisparse_plan.errors import UnsupportedRequestError
from hisparse_plan.models.layer_specs import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVLayerSpec,
)
from hisparse_plan.models.request import PlanRequest
from hisparse_plan.models.sglang_settings import SGLangSettings
from hisparse_plan.targets.sglang.model import HeadGroup, SGLangModel, one_shape

LLAMA4_HYBRID: Final = "Llama4ForConditionalGeneration"
"""The Llama-4 architecture SGLang serves as a window hybrid."""
FULL_EVERY: Final = 4
"""get_hybrid_layer_ids: every 4th layer (i + 1 divisible by 4) is a full-attention layer."""


def _field(name: str) -> str:
    return f"layers[{name!r}]"


def is_llama4_hybrid(request: PlanRequest, settings: SGLangSettings) -> bool:
    """SGLang lays this model out as a Llama-4 window hybrid: its architecture is
    Llama4ForConditionalGeneration, or unknown and the request has chunked-local layers."""
    if settings.architecture is not None:
        return settings.architecture == LLAMA4_HYBRID
    return any(isinstance(spec, ChunkedLocalAttentionSpec) for spec in request.layers.values())


def sglang_window_layer(position: int) -> bool:
    """get_hybrid_layer_ids' rule for Llama-4: the layer at `position` is a window layer."""
    return (position + 1) % FULL_EVERY != 0


def _attention_layers(request: PlanRequest) -> list[tuple[str, KVLayerSpec]]:
    """The request's layers, each full or chunked-local attention (Llama-4 has no other)."""
    layers: list[tuple[str, KVLayerSpec]] = []
    for name, spec in request.layers.items():
        if not isinstance(spec, FullAttentionSpec | ChunkedLocalAttentionSpec):
            raise UnsupportedRequestError(
                f"{_field(name)}.kind: a Llama-4 model's layers are full or chunked-local "
                f"attention in SGLang; expected full_attention or chunked_local_attention, got "
                f"{spec.kind}", field=f"{_field(name)}.kind",
            )
        layers.append((name, spec))
    return layers


def llama4_window(request: PlanRequest) -> int | None:
    """The window SGLang gives the window pool: the chunk of the chunked layers (one per
    model; differing chunks refused), or None where the request has none."""
    chunks = [(name, spec.attention_chunk_size) for name, spec in request.layers.items()
              if isinstance(spec, ChunkedLocalAttentionSpec)]
    if not chunks:
        return None
    first_name, window = chunks[0]
    for name, chunk in chunks:
        if chunk != window:
            raise UnsupportedRequestError(
                f"{_field(name)}.attention_chunk_size: SGLang has one window per model; "
                f"expected {window} as {_field(first_name)}, got {chunk}",
                field=f"{_field(name)}.attention_chunk_size",
            )
    return window


def read_llama4_model(
    request: PlanRequest, settings: SGLangSettings, kept: Collection[str] | None = None
) -> SGLangModel:
    """The full and window pools of a Llama-4 window hybrid: by SGLang's position rule for
    Llama4ForConditionalGeneration, by the request's kinds for an unknown architecture. The
    position is the layer's place in the whole model, as get_hybrid_layer_ids numbers it
    (`request` is the whole model; `kept`, a pipeline rank's layers, else all of them). A model
    without a full layer (fewer than 4 layers) is refused, as every window-only model."""
    layers = _attention_layers(request)
    by_position = settings.architecture == LLAMA4_HYBRID
    windowed = {name for i, (name, spec) in enumerate(layers)
                if (sglang_window_layer(i) if by_position
                    else isinstance(spec, ChunkedLocalAttentionSpec))}
    if all(name in windowed for name, _ in layers):
        raise UnsupportedRequestError(
            f"layers: a Llama-4 model of {len(layers)} layers has no full-attention layer in "
            "SGLang (every 4th is one), and a model of window layers only is not planned for "
            "SGLang; expected at least 4 layers", field="layers",
        )
    if kept is not None:
        layers = [(name, spec) for name, spec in layers if name in kept]
    swa = [(name, spec) for name, spec in layers if name in windowed]
    full = [(name, spec) for name, spec in layers if name not in windowed]
    window = llama4_window(request)
    swa_group: HeadGroup | None = (
        one_shape([n for n, _ in swa], [s for _, s in swa], window, "window") if swa else None
    )
    return SGLangModel(
        full=one_shape([n for n, _ in full], [s for _, s in full], None, "full-attention")
        if full else None,
        swa=swa_group, latent=None, mamba=None,
    )


WINDOW_KEYS: Final = ("sliding_window_size", "sliding_window", "window_size")
"""ModelConfig._get_sliding_window_size: the first of these the text config sets is the
window, before attention_chunk_size."""


def served_llama4_config(config: Mapping[str, Any], architecture: str) -> Mapping[str, Any]:
    """A Llama-4 window hybrid's config as SGLang serves it: a window key in the text config
    (sliding_window, ...) is the window pool's window in place of attention_chunk_size, so the
    chunked layers are read with it as their chunk (what sizes SGLang's window pool)."""
    if architecture != LLAMA4_HYBRID:
        return config
    text = config.get("text_config")
    fields = text if isinstance(text, Mapping) else config
    window = next((fields[key] for key in WINDOW_KEYS if fields.get(key) is not None), None)
    if window is None:
        return config
    served = {**fields, "attention_chunk_size": window}
    served = {key: value for key, value in served.items() if key not in WINDOW_KEYS}
    return {**config, "text_config": served} if isinstance(text, Mapping) else served
