"""The engines the plan format knows: the values of a plan's `engine` discriminator, and what
each engine beside the default brings to models/ (its plan type, the settings a request carries
for it). The one module of models/ that names an engine: a new engine adds its name and its
models here."""

from __future__ import annotations

from typing import Final

from hisparse_plan.models.sglang_plan import SGLangPlan
from hisparse_plan.models.sglang_settings import SGLangSettings

__all__ = ["DEFAULT_ENGINE", "ENGINE_NAMES", "SGLANG", "VLLM", "SGLangPlan", "SGLangSettings"]

VLLM: Final = "vllm"
"""vLLM's name: a `KVCachePlan`'s `engine`."""
SGLANG: Final = "sglang"
"""SGLang's name: an `SGLangPlan`'s `engine`, and `SGLangSettings.name` in a request."""
DEFAULT_ENGINE: Final = VLLM
"""The engine of a request that names none, and of a plan without `engine` (version 1)."""
ENGINE_NAMES: Final = (VLLM, SGLANG)
"""Every engine the plan format knows, the default first."""
