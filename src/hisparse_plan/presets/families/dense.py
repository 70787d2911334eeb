"""Dense attention families: every layer full attention, or every layer sliding.

- `generic` (Llama, Mistral, Mixtral, Phi-3, Command-R, and any `model_type` no other family
  claims): vLLM 0.34's `models/llama.py`, `mistral.py`, `mixtral.py`, `phi3.py` (Llama's code)
  and `commandr.py` (Cohere v1, which never slides) build one `Attention` a layer,
  `model.layers.{i}.self_attn.attn`, with `num_key_value_heads` KV heads of `head_dim` (else
  `hidden_size / num_attention_heads`) elements, in the model dtype; a layer slides when
  `layer_types` says `sliding_attention`, else every layer slides by the model's
  `sliding_window` when it has one. SGLang 0.5.23 (`srt/models/llama.py`, `mistral.py`,
  `mixtral.py`) keeps every layer's every token in one pool (none of them is a hybrid-SWA
  architecture), the window applied only when attending.
- `qwen` (Qwen2, Qwen2-MoE, Qwen3, Qwen3-MoE, Qwen2-VL, Qwen2.5-VL, Qwen2.5-Omni's thinker,
  whose language model `qwen2_5_omni_thinker.py` builds as `Qwen2ForCausalLM`): vLLM's `qwen2.py`,
  `qwen2_moe.py`, `qwen3.py`, `qwen3_moe.py` give every layer the model's one window when
  `use_sliding_window` is set with `max_window_layers` 0, none otherwise, and refuse a window on
  only some layers; transformers writes that out as `layer_types`. SGLang's `qwen2.py`,
  `qwen3.py`, `qwen3_moe.py`, `qwen2_5_vl.py`: one pool, as above.
"""

from __future__ import annotations

from typing import Final

from hisparse_plan.presets.errors import ConfigError
from hisparse_plan.presets.families import base
from hisparse_plan.presets.families.layer_names import ATTENTION_BY_MODEL_TYPE
from hisparse_plan.presets.regular import LayerKind

QWEN_TYPES: Final = (
    "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "qwen2_vl", "qwen2_vl_text", "qwen2_5_vl",
    "qwen2_5_vl_text", "qwen2_5_omni_text",
)


def read_generic(fields: base.Fields, layers: int) -> base.Layout:
    reads = ("layer_types", "sliding_window")
    template = ATTENTION_BY_MODEL_TYPE.get(str(fields.get("model_type")))
    names = {} if template is None else {"attention": template}
    if base.given(fields, "layer_types"):
        kinds = base.from_layer_types(fields, layers, base.LAYER_TYPE_KINDS, "this model's")
        return base.Layout(kinds, reads, names=names)
    kind: LayerKind = "sliding" if base.given(fields, "sliding_window") else "full"
    return base.Layout([kind] * layers, reads, names=names)


def read_qwen(fields: base.Fields, layers: int) -> base.Layout:
    reads = ("layer_types", "sliding_window", "use_sliding_window", "max_window_layers")
    if base.given(fields, "layer_types"):
        sliding = [k == "sliding" for k in
                   base.from_layer_types(fields, layers, base.LAYER_TYPE_KINDS, "Qwen")]
    else:
        first = fields.get("max_window_layers", layers)
        on = base.given(fields, "use_sliding_window") and base.given(fields, "sliding_window")
        sliding = [bool(on) and i >= first for i in range(layers)]
    if any(sliding) and not all(sliding):
        raise ConfigError(
            f"max_window_layers: a sliding window on layers {sliding.index(True)} and up only; "
            "vLLM's Qwen code gives every layer the model's one window and refuses this",
            field="max_window_layers",
        )
    if all(sliding):
        return base.Layout(["sliding"] * layers, reads)
    # No layer slides: the window field is left unread (Qwen2-MoE's class writes 0 there).
    return base.Layout(["full"] * layers, reads, fields={"sliding_window": None})


GENERIC = base.Family(
    name="generic",
    model_types=("llama", "mistral", "mixtral", "phi3", "cohere"),
    architectures=("LlamaForCausalLM", "LLaMAForCausalLM", "InternLM3ForCausalLM",
                   "IQuestCoderForCausalLM", "MistralForCausalLM", "MixtralForCausalLM",
                   "Phi3ForCausalLM", "CohereForCausalLM"),
    read=read_generic,
    vllm="models/llama.py, models/mistral.py, models/mixtral.py, models/phi3.py, "
         "models/commandr.py",
)
QWEN = base.Family(
    name="qwen",
    model_types=QWEN_TYPES,
    architectures=("Qwen2ForCausalLM", "Qwen2MoeForCausalLM", "Qwen3ForCausalLM",
                   "Qwen3MoeForCausalLM", "Qwen2VLForConditionalGeneration",
                   "Qwen2_5_VLForConditionalGeneration", "Qwen2_5OmniForConditionalGeneration"),
    read=read_qwen,
    vllm="models/qwen2.py, models/qwen2_moe.py, models/qwen3.py, models/qwen3_moe.py, "
         "models/qwen2_5_omni_thinker.py",
)
