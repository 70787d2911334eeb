"""Gemma-4 (`gemma4`, `gemma4_text`; DiffusionGemma's `diffusion_gemma_text`, the same decoder):
sliding and full layers of their own head sizes, the last layers reading earlier layers' caches.

vLLM 0.34's `models/gemma4.py`: `Gemma4DecoderLayer` takes each layer's head size and KV heads
from transformers' `per_layer_config[i]` (`Gemma4Attention`): transformers' Gemma4TextConfig
fills it in for a config.json that has none, giving each `full_attention` layer `head_dim =
global_head_dim` (default 512) and, where `attention_k_eq_v` is set, `num_global_key_value_heads`
KV heads; every other layer keeps `head_dim` and `num_key_value_heads`. A layer slides by
`sliding_window` where `layer_types` says `sliding_attention` (transformers writes the window
`sliding_window // 2 + 1` where `use_bidirectional_attention` is "all"). Of the last
`num_kv_shared_layers` layers, each reads the cache of the last layer before them of its own
type (`kv_sharing_target_layer_name`) and keeps none. `models/diffusion_gemma.py` builds the
same `Gemma4Model` as its `model` (layer names `model.layers.{i}.self_attn.attn`);
`models/gemma4_unified.py` builds its text config (`gemma4_unified_text`) as a
`Gemma4ForCausalLM` under `language_model.`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from hisparse_plan.presets.errors import ConfigError
from hisparse_plan.presets.families import base
from hisparse_plan.presets.regular import LayerKind

GLOBAL_HEAD_DIM: Final = 512
"""transformers' default `global_head_dim` of Gemma4TextConfig."""
PATTERN: Final = 6
"""transformers' Gemma4TextConfig without `layer_types`: five sliding layers, then a full one
(and the last layer is always full)."""


def gemma4_kinds(fields: base.Fields, layers: int) -> list[str]:
    """`layer_types` as transformers' Gemma4TextConfig leaves it (the last layer full)."""
    if base.given(fields, "layer_types"):
        types = [str(value) for value in base.layer_list(fields, "layer_types", layers)]
    else:
        types = ["sliding_attention" if (i + 1) % PATTERN else "full_attention"
                 for i in range(layers)]
    types[-1] = "full_attention"
    unknown = sorted(set(types) - set(base.LAYER_TYPE_KINDS))
    if unknown:
        raise ConfigError(f"layer_types: Gemma-4 layers are full_attention, sliding_attention in "
                          f"vLLM's model code; got {', '.join(unknown)}", field="layer_types")
    return types


def gemma4_heads(fields: base.Fields, types: list[str]) -> dict[int, tuple[int, int]]:
    """Layer -> (KV heads, head size) where it differs from the model's `num_key_value_heads`
    and `head_dim` (`per_layer_config` as transformers fills it in)."""
    kv = base.positive(fields, "num_key_value_heads", "Gemma-4's KV heads")
    size = base.positive(fields, "head_dim", "Gemma-4's sliding layers' head size")
    given = fields.get("per_layer_config")
    if given is not None and not isinstance(given, Mapping):
        raise ConfigError(f"per_layer_config: expected an object of layer -> fields, got "
                          f"{type(given).__name__}", field="per_layer_config")
    if isinstance(given, Mapping):
        overrides = {int(key): value for key, value in given.items()
                     if str(key).isdigit() and isinstance(value, Mapping)}
    else:
        full: dict[str, object] = {"head_dim": fields.get("global_head_dim") or GLOBAL_HEAD_DIM}
        if fields.get("attention_k_eq_v") and fields.get("num_global_key_value_heads"):
            full["num_key_value_heads"] = fields["num_global_key_value_heads"]
        overrides = {i: full for i, kind in enumerate(types) if kind == "full_attention"}
    heads: dict[int, tuple[int, int]] = {}
    for i, layer in sorted(overrides.items()):
        if i >= len(types):
            continue
        layer_kv = base.positive({**layer, "num_key_value_heads": layer.get(
            "num_key_value_heads", kv)}, "num_key_value_heads", f"layer {i}'s KV heads")
        layer_size = base.positive({**layer, "head_dim": layer.get("head_dim", size)},
                                   "head_dim", f"layer {i}'s head size")
        if (layer_kv, layer_size) != (kv, size):
            heads[i] = (layer_kv, layer_size)
    return heads


def gemma4_sharing(fields: base.Fields, types: list[str]) -> dict[int, int]:
    """Layer -> the layer whose cache it reads: each of the last `num_kv_shared_layers` reads
    the last layer before them of its type (`Gemma4Attention`)."""
    shared = base.integer(fields, "num_kv_shared_layers", "Gemma-4's layers that share caches")
    first = len(types) - shared
    reads: dict[int, int] = {}
    for i in range(max(first, 0), len(types)):
        earlier = [j for j in range(max(first, 0)) if types[j] == types[i]]
        if not earlier:
            raise ConfigError(
                f"num_kv_shared_layers: layer {i} ({types[i]}) reads the cache of the last "
                f"layer of its type before the last {shared}, and there is none; vLLM's "
                "Gemma-4 code cannot build this", field="num_kv_shared_layers")
        reads[i] = earlier[-1]
    return reads


def read_gemma4(fields: base.Fields, layers: int) -> base.Layout:
    types = gemma4_kinds(fields, layers)
    kinds: list[LayerKind] = [base.LAYER_TYPE_KINDS[kind] for kind in types]
    overrides: dict[str, object] = {}
    if "sliding" in kinds:
        window = base.positive(fields, "sliding_window", "Gemma-4's sliding layers' window")
        if fields.get("use_bidirectional_attention") == "all":
            overrides["sliding_window"] = window // 2 + 1
    sharing = gemma4_sharing(fields, types) if fields.get("num_kv_shared_layers") else {}
    return base.Layout(kinds, ("layer_types", "sliding_window", "num_kv_shared_layers"),
                       fields=overrides, reads_cache_of=sharing,
                       heads=gemma4_heads(fields, types))


GEMMA4 = base.Family(
    name="gemma4",
    model_types=("gemma4", "gemma4_text", "gemma4_unified", "gemma4_unified_text",
                 "diffusion_gemma", "diffusion_gemma_text"),
    architectures=("Gemma4ForCausalLM", "Gemma4ForConditionalGeneration",
                   "Gemma4UnifiedForConditionalGeneration", "DiffusionGemmaForBlockDiffusion"),
    read=read_gemma4,
    vllm="models/gemma4.py, models/gemma4_mm.py, models/gemma4_unified.py, "
         "models/diffusion_gemma.py",
)
