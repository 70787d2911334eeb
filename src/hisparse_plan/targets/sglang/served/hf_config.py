"""SGLang's own reading of a config.json, beside the layers the project reads from it: what
SGLang refuses to load (no model_type, an architecture its registry lacks), the architecture
and the context length it derives (configs/model_config.py, utils/hf_transformers), and the
config as SGLang serves it (MiniMax-M2's all-full attn_type_list). A pure function of the
dict; the adapters and the CLI put its facts into the request's SGLang settings."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from hisparse_plan.errors import PlanError, UnsupportedRequestError
from hisparse_plan.targets.sglang.served.llama4 import served_llama4_config
from hisparse_plan.targets.sglang.served.multimodal import (
    MULTIMODAL_ARCHITECTURES,
    VIT_BASELINE_HIDDEN,
    VIT_BASELINE_LAYERS,
)
from hisparse_plan.targets.sglang.served.qwen3_next_layers import refuse_unlike_layer_types
from hisparse_plan.targets.sglang.served.registry import SERVED_ARCHITECTURES

CONTEXT_LENGTH_KEYS: Final = (
    "max_sequence_length", "seq_length", "max_seq_len", "model_max_length",
    "max_position_embeddings",
)
"""SGLang's get_context_length reads the first of these the text config sets."""
FULL_ATTENTION: Final = 1
"""attn_type_list's value for a full-attention layer (0: lightning attention)."""


@dataclass(frozen=True)
class SGLangConfigFacts:
    """What SGLang reads of a config.json beside its layers."""

    architecture: str
    context_length: int | None
    """SGLang's derived context length; None where the config names none (SGLang would take
    the transformers class's default, which is not read here)."""
    config: Mapping[str, Any]
    """The config as SGLang serves it (the layers are read from this one)."""
    multimodal: bool = False
    """ModelConfig's is_multimodal before `--enable-multimodal`: a multimodal architecture or
    a config with a text_config, not language_model_only."""
    vision_encoder: tuple[int, int] | None = None
    """The vision_config's (num_hidden_layers, hidden_size) as SGLang's default-fraction rule
    reads them (`vision_encoder_size`); None without a vision_config."""
    index_topk: int | None = None
    """The text config's index_topk (hisparse_top_k_of): the top-k SGLang's HiSparse
    coordinator runs."""


def hisparse_top_k_of(config: Mapping[str, Any]) -> int | None:
    """The top-k ModelRunner.maybe_init_hisparse_coordinator hands SGLang's HiSparse
    coordinator: the text config's index_topk (DeepSeek-V3.2, GLM-5, DeepSeek-V4: 512),
    else None (hisparse_config's top_k runs)."""
    value = text_config(config).get("index_topk")
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language model's config: a multimodal config's text_config, else the config."""
    text = config.get("text_config")
    return text if isinstance(text, Mapping) else config


ROPE_BY_LAYER_TYPE: Final = frozenset({"gemma3", "gemma3_text"})
"""Text-config model types whose transformers 5 config class keys its rope parameters by layer
type (`Gemma3TextConfig.convert_rope_params_to_dict`: {"full_attention": {...},
"sliding_attention": {...}}), so the object SGLang reads has no top-level rope factor."""


def rope_keyed_by_layer_type(text: Mapping[str, Any]) -> bool:
    """Whether SGLang's get_context_length (utils/hf_transformers/common.py), reading
    `rope_scaling.get("factor", 1)` off the config object transformers 5 builds, finds no
    factor: the model type's rope parameters are one mapping a layer type (Gemma-3), so its
    context is max_position_embeddings unscaled (Gemma-3 27B: 131,072, not 8 x that)."""
    return text.get("model_type") in ROPE_BY_LAYER_TYPE


def derived_context_length(config: Mapping[str, Any]) -> int | None:
    """SGLang's get_context_length: the first context key the text config sets, times a rope
    scaling factor (1 for llama3 rope, where original_max_position_embeddings is given, and
    where transformers keys the rope by layer type: rope_keyed_by_layer_type)."""
    text = text_config(config)
    rope = text.get("rope_scaling")
    factor: Any = 1
    if isinstance(rope, Mapping) and rope and not rope_keyed_by_layer_type(text):
        factor = rope.get("factor", 1)
        if "original_max_position_embeddings" in rope or rope.get("rope_type") == "llama3":
            factor = 1
    for key in CONTEXT_LENGTH_KEYS:
        value = text.get(key)
        if value is not None:
            if not isinstance(value, int | float) or isinstance(value, bool) or not isinstance(
                    factor, int | float) or isinstance(factor, bool):
                raise PlanError(f"{key}: expected a number, got {value!r}", field=key)
            length = factor * value
            if not math.isfinite(length):  # NaN or infinity: JSON lets Python read them
                raise PlanError(f"{key}: expected a finite number (times the rope scaling "
                                f"factor {factor!r}), got {value!r}", field=key)
            return int(length)
    return None


def served_config(config: Mapping[str, Any], architecture: str) -> Mapping[str, Any]:
    """MiniMax-M2 lists attn_type_list with every layer 1 (full attention): SGLang serves it
    as a plain attention model, so the list is dropped before the layers are read."""
    types = config.get("attn_type_list")
    if (architecture == "MiniMaxM2ForCausalLM" and isinstance(types, list)
            and all(t == FULL_ATTENTION for t in types)):
        return {key: value for key, value in config.items() if key != "attn_type_list"}
    return config


def read_sglang_config(config: Mapping[str, Any]) -> SGLangConfigFacts:
    """The facts SGLang takes from `config`, or a refusal naming why SGLang cannot load it."""
    if not isinstance(config.get("model_type"), str):
        raise UnsupportedRequestError(
            "model_type: SGLang loads config.json through transformers' AutoConfig, which "
            "needs a model_type key; expected a string, got "
            f"{config.get('model_type')!r}",
            field="model_type",
        )
    archs = config.get("architectures")
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
        raise UnsupportedRequestError(
            "architectures: SGLang picks its model class by architectures[0]; expected a "
            f"non-empty list of names, got {archs!r}",
            field="architectures",
        )
    arch = archs[0]
    if arch not in SERVED_ARCHITECTURES:
        raise UnsupportedRequestError(
            f"architectures[0]: SGLang 0.5.23's model registry has no {arch!r}, so SGLang "
            "cannot load this model; expected an architecture it serves",
            field="architectures[0]",
        )
    refuse_unlike_layer_types(text_config(config), arch)
    multimodal = (arch in MULTIMODAL_ARCHITECTURES or isinstance(
        config.get("text_config"), Mapping)) and not config.get("language_model_only", False)
    served = served_llama4_config(served_config(config, arch), arch)
    return SGLangConfigFacts(arch, derived_context_length(config), served, multimodal,
                             vision_encoder_size(config), hisparse_top_k_of(config))


def vision_encoder_size(config: Mapping[str, Any]) -> tuple[int, int] | None:
    """(num_hidden_layers, hidden_size) of the config's vision_config, with the 24 and 1024
    SGLang's adjust_mem_fraction_for_vlm takes for a missing one (transformers' own class
    defaults, which a vision config class may set, are not read); None without one, or where
    a value is not a positive integer (SGLang's formula would not run on it)."""
    vision = config.get("vision_config")
    if not isinstance(vision, Mapping):
        return None
    layers = vision.get("num_hidden_layers", VIT_BASELINE_LAYERS)
    hidden = vision.get("hidden_size", VIT_BASELINE_HIDDEN)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0
               for v in (layers, hidden)):
        raise UnsupportedRequestError(
            "vision_config: SGLang's default mem_fraction_static reads its num_hidden_layers "
            f"and hidden_size; expected positive integers, got {layers!r} and {hidden!r}",
            field="vision_config",
        )
    return layers, hidden
