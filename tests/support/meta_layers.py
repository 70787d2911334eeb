"""A request's layers as a vLLM meta build's pinned table records them: each own-cache layer's
facts of `MODEL_FACTS`, and each layer that reads another's cache with its target (the
registry sweep's and the transformers sweep's tables alike)."""

from __future__ import annotations

from typing import Any

from hisparse_plan.adapters.vllm.meta_model import MODEL_FACTS
from hisparse_plan.models import PlanRequest


def meta_layers(request: PlanRequest) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """(own-cache layer -> its model facts, sharing layer -> the layer it reads)."""
    layers = {name: {key: value for key, value
                     in spec.model_dump(mode="json", exclude_none=True).items()
                     if key in MODEL_FACTS}
              for name, spec in request.layers.items()
              if getattr(spec, "kv_sharing_target", None) is None}
    shared = {name: target for name, spec in request.layers.items()
              if (target := getattr(spec, "kv_sharing_target", None)) is not None}
    return layers, shared
