"""Llama-4's chunked local attention.

vLLM 0.34's `models/llama4.py` (and `mllama4.py` around it) builds one attention layer a decoder
layer, `model.layers.{i}.self_attn.attn` (under `language_model.` in the multimodal wrapper),
`num_key_value_heads` KV heads of `head_dim`: a NoPE layer (`no_rope_layers[i] == 0`; without
the list every `no_rope_layer_interval`-th, default 4th) is full attention, every other layer
chunked local attention over `attention_chunk_size` tokens when the model sets one. SGLang
0.5.23 keeps Llama4ForConditionalGeneration's window layers (every layer but each 4th) in its
window pool: the SGLang target's rule, targets/sglang/served/llama4.py.
"""

from __future__ import annotations

from typing import Final

from hisparse_plan.presets.errors import ConfigError
from hisparse_plan.presets.families import base
from hisparse_plan.presets.regular import LayerKind

NOPE_INTERVAL: Final = 4
"""transformers' default `no_rope_layer_interval` for Llama-4."""


def read_llama4(fields: base.Fields, layers: int) -> base.Layout:
    reads = ("attention_chunk_size", "no_rope_layers", "layer_types", "sliding_window")
    interval = fields.get("no_rope_layer_interval", NOPE_INTERVAL)
    nope = (
        base.layer_list(fields, "no_rope_layers", layers) if base.given(fields, "no_rope_layers")
        else [int((i + 1) % interval != 0) for i in range(layers)]
    )
    chunked = base.given(fields, "attention_chunk_size")
    kinds: list[LayerKind] = [
        "chunked" if chunked and nope[i] != 0 else "full" for i in range(layers)
    ]
    if base.given(fields, "layer_types"):
        stated = base.from_layer_types(
            fields, layers, {"full_attention": "full", "chunked_attention": "chunked"}, "Llama-4"
        )
        if stated != kinds:
            raise ConfigError(
                "layer_types: vLLM's Llama-4 code chunks every RoPE layer (no_rope_layers) when "
                "attention_chunk_size is set; this config's layer_types differs",
                field="layer_types",
            )
    return base.Layout(kinds, reads)


LLAMA4 = base.Family(
    name="llama4",
    model_types=("llama4", "llama4_text"),
    architectures=("Llama4ForCausalLM", "Llama4ForConditionalGeneration"),
    read=read_llama4,
    vllm="models/llama4.py, models/mllama4.py",
)
