"""Layer names vLLM 0.34's model code gives where they are not the Llama-like defaults (each
read off the model file named, and checked by the registry sweep's meta builds:
docs/vllm-registry.md).

- By text `model_type`, the attention layer's template: Falcon (`models/falcon.py`:
  `transformer.h.{i}.self_attention.attn`), OPT (`models/opt.py`, also BLIP-2's language
  model: `model.decoder.layers.{i}.self_attn.attn`), GPT-2, GPT-SW3 and GPT-J (`models/gpt2.py`,
  `gpt_j.py`: `transformer.h.{i}.attn.attn`), BLOOM (`models/bloom.py`:
  `transformer.h.{i}.self_attention.attn`) and DBRX (`models/dbrx.py`:
  `transformer.blocks.{i}.norm_attn_norm.attn.attn`).
- By architecture, the prefix of the language model's names inside a wrapper, where it is not
  `language_model.` exactly when the config has a `vision_config`: the audio and speech
  wrappers (`models/audioflamingo3.py`, `glmasr.py`, `granite_speech.py`, `qwen2_audio.py`)
  and Qwen2.5-Omni's thinker (`qwen2_5_omni_thinker.py`) put it under `language_model.`
  without a top-level vision_config; LFM2-VL (`lfm2_vl.py`) under `language.`; Idefics3 and
  SmolVLM (`models/idefics3.py`, `smolvlm.py`) hold the text model as `model.text_model` (its
  `model.layers...` names become `model.text_model.layers...`); MuseGlimmer's wrapper,
  Qwen3.5's text-only classes (`models/muse_glimmer.py`, `qwen3_5.py`'s `*ForCausalLM`) and
  DiffusionGemma (`models/diffusion_gemma.py`) keep the text model's own names although their
  configs carry a vision_config.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

ATTENTION_BY_MODEL_TYPE: Final = {
    "falcon": "transformer.h.{i}.self_attention.attn",
    "opt": "model.decoder.layers.{i}.self_attn.attn",
    "gpt2": "transformer.h.{i}.attn.attn",
    "gpt-sw3": "transformer.h.{i}.attn.attn",
    "gptj": "transformer.h.{i}.attn.attn",
    "bloom": "transformer.h.{i}.self_attention.attn",
    "dbrx": "transformer.blocks.{i}.norm_attn_norm.attn.attn",
}
LANGUAGE_MODEL_PREFIX: Final = {
    "AudioFlamingo3ForConditionalGeneration": "language_model.",
    "GlmAsrForConditionalGeneration": "language_model.",
    "GraniteSpeechForConditionalGeneration": "language_model.",
    "GraniteSpeechPlusForConditionalGeneration": "language_model.",
    "Qwen2AudioForConditionalGeneration": "language_model.",
    # models/qwen2_5_omni_thinker.py: its vision_config is inside thinker_config.
    "Qwen2_5OmniForConditionalGeneration": "language_model.",
    # "model.text_" + "model.layers.{i}..." is vLLM's "model.text_model.layers.{i}...".
    "Idefics3ForConditionalGeneration": "model.text_",
    "SmolVLMForConditionalGeneration": "model.text_",
    "MuseGlimmerForConditionalGeneration": "",
    "Qwen3_5ForCausalLM": "",
    "Qwen3_5MoeForCausalLM": "",
    # models/lfm2_vl.py: the language model is `self.language`, not `language_model`.
    "Lfm2VlForConditionalGeneration": "language.",
    # models/diffusion_gemma.py: its Gemma4Model is `self.model`, beside the vision tower.
    "DiffusionGemmaForBlockDiffusion": "",
    # models/inkling/nvidia/model.py: the text model is `self.model`, beside `visual` and
    # `audio`.
    "InklingForConditionalGeneration": "",
}
WRAPPER_PREFIX: Final = "language_model."
"""vLLM's multimodal models keep the language model under `language_model.`."""


def language_model_prefix(config: Mapping[str, Any]) -> str:
    """The prefix vLLM gives the language model's layer names for this config."""
    names = config.get("architectures")
    for name in names if isinstance(names, Sequence) and not isinstance(names, str) else ():
        if isinstance(name, str) and name in LANGUAGE_MODEL_PREFIX:
            return LANGUAGE_MODEL_PREFIX[name]
    return WRAPPER_PREFIX if "vision_config" in config else ""
