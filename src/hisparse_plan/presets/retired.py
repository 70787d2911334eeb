"""Architectures vLLM 0.34 no longer serves: its registry keeps their names with the last
version that did (`_PREVIOUSLY_SUPPORTED_MODELS` in `model_executor/models/registry.py`) and
refuses a config that names one, whatever its fields say. The reader refuses them with that
reason rather than planning layers vLLM would not build (dots1's `max_window_layers` is never
read by any vLLM 0.34 code: no class builds Dots1ForCausalLM)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from hisparse_plan.presets.errors import ConfigError

LAST_SERVED_BY: Final[dict[str, str]] = {
    "MotifForCausalLM": "0.10.2", "Phi3SmallForCausalLM": "0.9.2",
    "Phi4FlashForCausalLM": "0.10.2", "Phi4MultimodalForCausalLM": "0.12.0",
    "JAISLMHeadModel": "0.22.0", "InternLM2VEForCausalLM": "0.23.0",
    "QWenLMHeadModel": "0.23.0", "QwenVLForConditionalGeneration": "0.23.0",
    "InternLMForCausalLM": "0.23.0", "DonutForConditionalGeneration": "0.10.2",
    "MllamaForConditionalGeneration": "0.10.2", "XverseForCausalLM": "0.23.0",
    "Dots1ForCausalLM": "0.23.0", "BambaForCausalLM": "0.23.0",
    "MiniMaxForCausalLM": "0.23.0", "MiniMaxText01ForCausalLM": "0.23.0",
    "MiniMaxM1ForCausalLM": "0.23.0", "MiniMaxVL01ForConditionalGeneration": "0.23.0",
    "BaiChuanForCausalLM": "0.23.0", "BaichuanForCausalLM": "0.23.0",
    "AquilaModel": "0.24.0", "AquilaForCausalLM": "0.24.0",
    "Grok1ModelForCausalLM": "0.24.0", "Grok1ForCausalLM": "0.24.0",
    "TarsierForConditionalGeneration": "0.24.0", "Tarsier2ForConditionalGeneration": "0.23.0",
    "MantisForConditionalGeneration": "0.24.0", "AyaVisionForConditionalGeneration": "0.24.0",
    "MusicFlamingoForConditionalGeneration": "0.24.0", "TeleChatForCausalLM": "0.25.0",
    "PersimmonForCausalLM": "0.25.0", "FuyuForCausalLM": "0.25.0",
    "Plamo2ForCausalLM": "0.26.0", "OuroForCausalLM": "0.26.0",
    "ArcticForCausalLM": "0.28.0", "ChameleonForConditionalGeneration": "0.28.0",
    "Fairseq2LlamaForCausalLM": "0.28.0", "HCXVisionForCausalLM": "0.28.0",
    "MPTForCausalLM": "0.28.0", "MptForCausalLM": "0.28.0", "RWForCausalLM": "0.28.0",
    "StableLMEpochForCausalLM": "0.28.0", "KeyeForConditionalGeneration": "0.33.0",
    "KeyeVL1_5ForConditionalGeneration": "0.33.0",
}
"""vLLM 0.34's retired generation architectures -> the last vLLM version that served each."""


def refuse_retired(config: Mapping[str, Any], origin: str) -> None:
    """Refuse a config whose every architecture vLLM 0.34 has retired, naming the first with
    the version vLLM's own refusal names."""
    names = config.get("architectures")
    if not isinstance(names, list) or not names:
        return
    if all(isinstance(name, str) and name in LAST_SERVED_BY for name in names):
        first = names[0]
        raise ConfigError(
            f"{origin}: architectures: vLLM 0.34 does not serve {first}: it was supported "
            f"until vLLM v{LAST_SERVED_BY[first]} and is not anymore (vLLM's registry, "
            "_PREVIOUSLY_SUPPORTED_MODELS); expected an architecture vLLM 0.34 serves",
            field="architectures",
        )
