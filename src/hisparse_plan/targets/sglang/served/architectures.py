"""What SGLang 0.5.23 serves of a model, read-stage rules (read.py), one function each: an
architecture its model registry holds, the architectures whose window layers get a pool of
their own (every other model's window layers share the one full pool), and the context length
it refuses above the model's own."""

from __future__ import annotations

from typing import Final

from hisparse_plan.errors import UnsupportedRequestError
from hisparse_plan.models.sglang_settings import SGLangSettings
from hisparse_plan.targets.sglang.served.registry import SERVED_ARCHITECTURES

HYBRID_SWA_ARCHITECTURES: Final = frozenset({
    "BeamForCausalLM", "Llama4ForConditionalGeneration", "DeepseekV4ForCausalLM",
    "DeepseekV4ForCausalLMNextN", "DeepseekV4ForCausalLMDSpark", "GptOssForCausalLM",
    "GraniteSWAForCausalLM", "GraniteMoeSWAForCausalLM", "IQuestQ1ForCausalLM", "IQuestQ1MTP",
    "MiMoV2ForCausalLM", "MiMoV2FlashForCausalLM", "MiMoV2MTP", "Step3p5ForCausalLM",
    "Step3p5MTP", "Step3p7ForConditionalGeneration", "Gemma4ForCausalLM",
    "Gemma4ForConditionalGeneration", "EmbeddingGemma2Model",
    "Gemma4UnifiedForConditionalGeneration", "DiffusionGemmaForBlockDiffusion",
    "LagunaForCausalLM", "MellumForCausalLM", "MuseGlimmerForCausalLM",
    "MuseGlimmerForConditionalGeneration", "InklingForConditionalGeneration",
    "InklingForConditionalGenerationMTP", "UnlimitedOCRForCausalLM",
})
"""`is_hybrid_swa_model` in SGLang's configs/model_config.py (with SWA_SINK_ARCHS and
MIMO_V2_MODEL_ARCHS): the architectures whose window layers SGLang keeps in a window pool.
Gemma-2 and Gemma-3 are not among them."""


def refuse_unserved_architecture(settings: SGLangSettings) -> None:
    """SGLang loads a model class by the config's architecture; one its registry lacks (Jamba,
    MiniMax-M1) cannot be served."""
    arch = settings.architecture
    if arch is not None and arch not in SERVED_ARCHITECTURES:
        raise UnsupportedRequestError(
            f"engine.architecture: SGLang 0.5.23's model registry has no {arch!r}, so SGLang "
            "cannot load this model; expected an architecture it serves (see "
            "docs/planning-rules.md#sglang)",
            field="engine.architecture",
        )


def windows_in_full_pool(settings: SGLangSettings) -> bool:
    """True when SGLang keeps this model's sliding-window layers in its one full pool (every
    token of every layer): a known architecture outside SGLang's hybrid-window list, as
    Gemma-2, Gemma-3, Mistral and Qwen2 with sliding windows are. An unknown architecture
    keeps the window pool the layers ask for."""
    arch = settings.architecture
    return arch is not None and arch not in HYBRID_SWA_ARCHITECTURES


def refuse_longer_context(settings: SGLangSettings) -> None:
    """SGLang refuses a context_length above the model's derived one unless
    SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 (allow_overwrite_longer_context_len)."""
    derived = settings.model_context_length
    if (derived is not None and settings.context_length > derived
            and not settings.allow_overwrite_longer_context_len):
        raise UnsupportedRequestError(
            f"engine.context_length: SGLang refuses a context length above the model's "
            f"derived {derived} unless SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1; expected "
            f"at most {derived} or engine.allow_overwrite_longer_context_len true, got "
            f"{settings.context_length}",
            field="engine.context_length",
        )
