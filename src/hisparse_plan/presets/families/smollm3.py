"""SmolLM3: vLLM 0.34 serves SmolLM3ForCausalLM through its Transformers backend
(`_TRANSFORMERS_SUPPORTED_MODELS` -> `models/transformers/base.py`), which builds one Attention
a layer, `model.layers.{i}.self_attn.attn`, `num_key_value_heads` KV heads of `head_dim` (else
`hidden_size / num_attention_heads`), sliding by `sliding_window` exactly where the config's
`layer_types` says `sliding_attention`, and reads no other window field.

`layer_types` comes from transformers' SmolLM3Config when the file has none: layer i slides
when `use_sliding_window` is set, `sliding_window` is not null and the layer is a NoPE layer
(`no_rope_layers[i] == 0`; without the list every `no_rope_layer_interval`-th layer, default 4,
is NoPE). `max_window_layers`, which SmolLM3's published config carries, is read by neither
transformers' class nor vLLM. SGLang 0.5.23 has no SmolLM3 model class of its own: refused.
"""

from __future__ import annotations

from typing import Final

from hisparse_plan.presets.families import base
from hisparse_plan.presets.regular import LayerKind

NOPE_INTERVAL: Final = 4
"""transformers' default `no_rope_layer_interval` of SmolLM3Config."""


def read_smollm3(fields: base.Fields, layers: int) -> base.Layout:
    reads = ("layer_types", "sliding_window", "use_sliding_window", "max_window_layers",
             "no_rope_layers")
    if base.given(fields, "layer_types"):
        return base.Layout(
            base.from_layer_types(fields, layers, base.LAYER_TYPE_KINDS, "SmolLM3"), reads)
    if base.given(fields, "no_rope_layers"):
        rope = base.layer_list(fields, "no_rope_layers", layers)
    else:
        every = base.positive(fields, "no_rope_layer_interval", "SmolLM3's NoPE interval") if (
            "no_rope_layer_interval" in fields) else NOPE_INTERVAL
        rope = [int((i + 1) % every != 0) for i in range(layers)]
    window = base.given(fields, "use_sliding_window") and base.given(fields, "sliding_window")
    kinds: list[LayerKind] = ["sliding" if window and not rope[i] else "full"
                              for i in range(layers)]
    return base.Layout(kinds, reads)


SMOLLM3 = base.Family(
    name="smollm3",
    model_types=("smollm3",),
    architectures=("SmolLM3ForCausalLM",),
    read=read_smollm3,
    vllm="models/transformers/base.py (the Transformers backend)",
    sglang=base.SGLangRule(refusal="SGLang 0.5.23 has no model class of its own for SmolLM3, "
                                   "and the SGLang target does not plan its Transformers "
                                   "fallback"),
)
