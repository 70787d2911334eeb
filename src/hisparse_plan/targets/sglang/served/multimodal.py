"""The multimodal reserve, a size-stage rule (size.py): SGLang takes the memory its
multimodal runtime allocates after the pools are sized (the embedding cache,
SGLANG_VLM_CACHE_SIZE_MB = 100 by default) out of the KV budget (`mm_runtime_reservation_gb`
in mem_cache/kv_cache_configurator.py), for a multimodal model served with
`--enable-multimodal` (ModelConfig.is_multimodal: without it SGLang reserves nothing). The CUDA
IPC / VMM feature-transport pools it also reserves for are opt-in or multi-node: not planned."""

from __future__ import annotations

from typing import Final

from hisparse_plan.models.sglang_settings import SGLangSettings

MULTIMODAL_ARCHITECTURES: Final = frozenset({
    "CLIPModel",
    "Cohere2VisionForConditionalGeneration",
    "Cosmos3EdgeForConditionalGeneration",
    "DeepseekVL2ForCausalLM",
    "Ernie4_5_VLMoeForConditionalGeneration",
    "MiniMaxM3SparseForConditionalGeneration",
    "Gemma3ForConditionalGeneration",
    "Gemma3nForConditionalGeneration",
    "Gemma4ForConditionalGeneration",
    "EmbeddingGemma2Model",
    "Gemma4UnifiedForConditionalGeneration",
    "DiffusionGemmaForBlockDiffusion",
    "Glm4vForConditionalGeneration",
    "Glm4vMoeForConditionalGeneration",
    "Glm5NextForConditionalGeneration",
    "GlmOcrForConditionalGeneration",
    "GlmAsrForConditionalGeneration",
    "GlmImageForConditionalGeneration",
    "Grok1VForCausalLM",
    "Grok1AForCausalLM",
    "LlavaLlamaForCausalLM",
    "Llama4ForConditionalGeneration",
    "LlavaMistralForCausalLM",
    "LlavaQwenForCausalLM",
    "LlavaForConditionalGeneration",
    "LlavaVidForCausalLM",
    "Lfm2VlForConditionalGeneration",
    "LightOnOCRForConditionalGeneration",
    "MiMoV2ASRForCausalLM",
    "MiniCPMO",
    "MiniCPMV",
    "Mistral3ForConditionalGeneration",
    "MultiModalityCausalLM",
    "MllamaForConditionalGeneration",
    "MossVLForConditionalGeneration",
    "NemotronH_Nano_VL_V2",
    "NemotronH_Nano_Omni_Reasoning_V3",
    "NemotronH_Omni_Reasoning_V3",
    "MuseGlimmerForConditionalGeneration",
    "MuseSparkForConditionalGeneration",
    "PixtralForConditionalGeneration",
    "Qwen2AudioForConditionalGeneration",
    "Qwen2VLForConditionalGeneration",
    "Qwen2_5_VLForConditionalGeneration",
    "Qwen3VLForConditionalGeneration",
    "Qwen3VLMoeForConditionalGeneration",
    "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration",
    "Qwen4ExpForConditionalGeneration",
    "InternS2PreviewForConditionalGeneration",
    "InternS2MobiusForConditionalGeneration",
    "Qwen3ASRForConditionalGeneration",
    "Qwen3OmniMoeForConditionalGeneration",
    "KimiVLForConditionalGeneration",
    "LocateAnythingForConditionalGeneration",
    "InternVLChatModel",
    "InternS1ForConditionalGeneration",
    "InternS1ProForConditionalGeneration",
    "Phi4MMForCausalLM",
    "VoxtralForConditionalGeneration",
    "WhisperForConditionalGeneration",
    "Step3VLForConditionalGeneration",
    "POINTSV15ChatModel",
    "DotsVLMForCausalLM",
    "Dots3NoteForCausalLM",
    "DotsOCRForCausalLM",
    "Sarashina2VisionForCausalLM",
    "NVILAForConditionalGeneration",
    "NVILALiteForConditionalGeneration",
    "DeepseekOCRForCausalLM",
    "UnlimitedOCRForCausalLM",
    "JetVLMForConditionalGeneration",
    "PaddleOCRVLForConditionalGeneration",
    "MiDashengLMModel",
    "StepVLForConditionalGeneration",
    "Step3p7ForConditionalGeneration",
    "KimiK25ForConditionalGeneration",
    "BailingMMNativeForConditionalGeneration",
    "BailingMM2NativeForConditionalGeneration",
    "BailingMoeV3VLForConditionalGeneration",
    "MiMoV2ForCausalLM",
})
"""SGLang's `multimodal_model_archs` (configs/model_config.py): is_multimodal_model."""
MULTIMODAL_OFF_BY_DEFAULT: Final = frozenset({
    "Gemma3ForConditionalGeneration", "Llama4ForConditionalGeneration",
    "Step3VLForConditionalGeneration", "InklingForConditionalGeneration",
})
"""ModelConfig's `mm_disabled_models`: without `--enable-multimodal` these serve text only."""
VLM_CACHE_MB: Final = 100
"""SGLANG_VLM_CACHE_SIZE_MB's default."""
BREAKABLE_GRAPH_ARCHITECTURES: Final = frozenset({
    "MiniMaxM3SparseForConditionalGeneration", "Cohere2VisionForConditionalGeneration",
    "Glm5NextForConditionalGeneration", "InternS2MobiusForConditionalGeneration",
    "PaddleOCRVLForConditionalGeneration", "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration", "Qwen4ExpForConditionalGeneration",
    "MuseGlimmerForConditionalGeneration", "MuseSparkForConditionalGeneration",
    "KimiK3ForConditionalGeneration", "KimiK25ForConditionalGeneration",
})
"""SGLang's `multimodal_breakable_cuda_graph_supported_model_archs`: the multimodal models
that keep prefill graphs; every other multimodal model served multimodal captures none."""
VIT_BASELINE_LAYERS: Final = 24
VIT_BASELINE_HIDDEN: Final = 1024
"""ViT-L/14, the encoder SGLang's multimodal fraction rule measures others against (and the
values it takes for a vision_config that leaves them out)."""
VLM_BASE_FACTOR: Final = 0.95
VLM_FACTOR_PER_DOUBLING: Final = 0.1
VLM_FACTOR_BOUNDS: Final = (0.8, 1.05)


def is_multimodal(settings: SGLangSettings) -> bool:
    """ModelConfig.is_multimodal: multimodal serving on (`--enable-multimodal`, by default on
    except MULTIMODAL_OFF_BY_DEFAULT) for a model SGLang counts as multimodal
    (model_is_multimodal, read from its config; else its architecture's listing). A text-only
    MiMoV2 checkpoint (SGLang turns it off without vision and audio configs) is not told
    apart."""
    enabled = settings.enable_multimodal
    if enabled is None:
        enabled = settings.architecture not in MULTIMODAL_OFF_BY_DEFAULT
    if not enabled:
        return False
    if settings.model_is_multimodal is not None:
        return settings.model_is_multimodal
    return settings.architecture in MULTIMODAL_ARCHITECTURES


def mm_reservation_gb(settings: SGLangSettings) -> float:
    """GB (2**30 bytes) the multimodal runtime keeps out of the KV budget: 100 MB / 1024."""
    return VLM_CACHE_MB / 1024 if is_multimodal(settings) else 0.0


def prefill_graphs_allowed(settings: SGLangSettings) -> bool:
    """Whether a model keeps SGLang's prefill graphs as far as multimodal serving goes: a
    model served multimodal captures none unless its architecture is listed as safe
    (BREAKABLE_GRAPH_ARCHITECTURES)."""
    return not is_multimodal(settings) or settings.architecture in BREAKABLE_GRAPH_ARCHITECTURES


def multimodal_fraction(fraction: float, settings: SGLangSettings) -> float:
    """SGLang's default mem_fraction_static for a model served multimodal
    (adjust_mem_fraction_for_vlm): 0.95 of it, times a factor that drops 0.1 for each
    ViT-L/14's worth of encoder weights (layers x hidden^2) above one, within 0.8..1.05; not
    rounded again. Unchanged for a text-only serving or without a vision_config."""
    if not is_multimodal(settings) or settings.vision_encoder is None:
        return fraction
    layers, hidden = settings.vision_encoder
    ratio = layers * hidden**2 / (VIT_BASELINE_LAYERS * VIT_BASELINE_HIDDEN**2)
    low, high = VLM_FACTOR_BOUNDS
    factor = max(low, min(high, 1.0 - VLM_FACTOR_PER_DOUBLING * (ratio - 1.0)))
    return fraction * (VLM_BASE_FACTOR * factor)
