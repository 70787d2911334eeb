"""Gemma's sliding-window patterns.

- `gemma` (Gemma-2, Gemma-3): vLLM 0.34's `models/gemma2.py`, `gemma3.py` (and `gemma3_mm.py`
  around it) build one `Attention` a layer, `model.layers.{i}.self_attn.attn` (under
  `language_model.` in the multimodal wrapper), `num_key_value_heads` KV heads of `head_dim`
  elements in the model dtype; a layer slides by `sliding_window` when `layer_types` says
  `sliding_attention`. Without `layer_types` (transformers writes it out): Gemma-2 slides on
  even layers, Gemma-3 on every layer but each `sliding_window_pattern`-th (default 6). SGLang
  0.5.23's `srt/models/gemma2.py`, `gemma3_causal.py`, `gemma3_mm.py` are not hybrid-SWA
  architectures: one pool keeps every layer's every token.
- `gemma3n` (Gemma-3n): vLLM's `models/gemma3n.py` lays out `layer_types` the same way, but
  the last `num_kv_shared_layers` layers keep no cache: each reads the cache of the last earlier
  layer of its kind (`kv_sharing_target_layer_name`), so vLLM allocates the first
  `num_hidden_layers - num_kv_shared_layers` layers only (20 of Gemma-3n-E4B's 35: 16 sliding,
  4 full); the request names each one's target in `kv_sharing_target`. SGLang's
  `gemma3n_causal.py` points them at the same targets (RadixAttention's layer_id) but its KV
  pool still holds a buffer for every layer (targets/sglang/kv_sharing.py).
"""

from __future__ import annotations

from typing import Final

from hisparse_plan.presets.errors import ConfigError
from hisparse_plan.presets.families import base

GEMMA3_PATTERN: Final = 6
"""transformers' default `sliding_window_pattern` for Gemma-3."""


def read_gemma(fields: base.Fields, layers: int) -> base.Layout:
    reads = ("layer_types", "sliding_window", "sliding_window_pattern")
    if base.given(fields, "layer_types"):
        kinds = base.from_layer_types(fields, layers, base.LAYER_TYPE_KINDS, "Gemma")
        return base.Layout(kinds, reads)
    if fields.get("model_type") == "gemma2":
        return base.Layout(["sliding" if i % 2 == 0 else "full" for i in range(layers)], reads)
    every = fields.get("sliding_window_pattern", GEMMA3_PATTERN)
    if not isinstance(every, int) or every < 1:
        raise ConfigError(f"sliding_window_pattern: expected a positive integer, got {every!r}",
                          field="sliding_window_pattern")
    return base.Layout(base.every_nth(layers, every, "full", "sliding"), reads)


def read_gemma3n(fields: base.Fields, layers: int) -> base.Layout:
    """`layer_types` and the layers whose caches are shared: from layer `first` (=
    num_hidden_layers - num_kv_shared_layers) on, a sliding layer reads layer `first - 2`'s
    cache and a full one layer `first - 1`'s, as vLLM's Gemma3nAttention names its target."""
    kinds = base.from_layer_types(fields, layers, base.LAYER_TYPE_KINDS, "Gemma-3n")
    shared = base.integer(fields, "num_kv_shared_layers", "Gemma-3n's layers that share caches")
    first = layers - shared
    if shared and first < 2:
        raise ConfigError(
            f"num_kv_shared_layers: expected at most {layers - 2} of the {layers} layers (two "
            f"must keep the caches the rest read), got {shared}",
            field="num_kv_shared_layers",
        )
    reads_cache_of = {
        i: first - (2 if kinds[i] == "sliding" else 1) for i in range(first, layers)
    }
    return base.Layout(kinds, ("layer_types", "sliding_window", "num_kv_shared_layers"),
                  reads_cache_of=reads_cache_of)


GEMMA = base.Family(
    name="gemma",
    model_types=("gemma2", "gemma3", "gemma3_text"),
    architectures=("Gemma2ForCausalLM", "Gemma3ForCausalLM", "Gemma3ForConditionalGeneration"),
    read=read_gemma,
    vllm="models/gemma2.py, models/gemma3.py, models/gemma3_mm.py",
)
GEMMA3N = base.Family(
    name="gemma3n",
    model_types=("gemma3n", "gemma3n_text"),
    architectures=("Gemma3nForCausalLM", "Gemma3nForConditionalGeneration"),
    read=read_gemma3n,
    vllm="models/gemma3n.py, models/gemma3n_mm.py",
)
