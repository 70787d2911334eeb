"""Requests that name the GPU they run on (`device.compute_capability`), for the tests of the
kernels' stride rules: DeepSeek-V3.2 without HiSparse in a chosen layout."""

from __future__ import annotations

from typing import Any

from hisparse_plan.models import KVCacheLayout, PlanRequest
from hisparse_plan.presets import Settings, build_request, load_preset

V32 = load_preset("deepseek-v3.2").architecture


def on_gpu(request: PlanRequest, capability: list[int] | None) -> PlanRequest:
    """The request on the GPU of `capability` ([major, minor]; None: no GPU named)."""
    data = request.model_dump(mode="json")
    data["device"]["compute_capability"] = capability
    return PlanRequest.model_validate(data)


def v32(layout: KVCacheLayout, **settings: Any) -> PlanRequest:
    """DeepSeek-V3.2 without HiSparse in `layout`."""
    return build_request(V32, Settings(hisparse=False, layout=layout, **settings))
