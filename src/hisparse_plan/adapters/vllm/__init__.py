"""hisparse_plan for vLLM 0.33 and 0.34: requests from its objects, plans as its KVCacheConfig, a
builder. May import what adapters/ may; vLLM itself only inside a call (the `vllm` extra).

The builder is a `KVCacheConfigBuilder` that plans through hisparse_plan inside vLLM.

vLLM is imported only inside these functions, so this module imports without it.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from dataclasses import replace

from hisparse_plan.adapters.vllm import kv_sharing
from hisparse_plan.adapters.vllm.kernel_contracts import engine_capability
from hisparse_plan.adapters.vllm.kv_cache_config import to_kv_cache_config, to_kv_cache_configs
from hisparse_plan.adapters.vllm.off_cuda import hisparse_off_cuda
from hisparse_plan.adapters.vllm.settings import (
    EngineSettings,
    HisparseSettings,
    request_dict,
    request_from_settings,
    settings_from_vllm,
)
from hisparse_plan.adapters.vllm.types import VllmObject
from hisparse_plan.errors import PlanError, UnsupportedRequestError
from hisparse_plan.models import PlanRequest

BUILDER_QUALNAME = "hisparse_plan.adapters.vllm.builder.HisparsePlanKVCacheConfigBuilder"
PLUGIN_SWITCH = "HISPARSE_PLAN_VLLM_BUILDER"
"""Set to 1 to let the `vllm.general_plugins` entry point (`register`) install the builder."""

__all__ = [
    "BUILDER_QUALNAME",
    "PLUGIN_SWITCH",
    "EngineSettings",
    "HisparseSettings",
    "hisparse_off_cuda",
    "install_builder",
    "register",
    "request_dict",
    "request_from_vllm",
    "to_kv_cache_config",
    "to_kv_cache_configs",
]


def request_from_vllm(
    kv_cache_specs: Mapping[str, VllmObject],
    vllm_config: VllmObject,
    available_bytes: int,
    host_pool_bytes: int | None = None,
    shared_kv_cache_layers: Mapping[str, str] | None = None,
) -> PlanRequest:
    """The plan request for vLLM's `dict[str, KVCacheSpec]` (one worker's, in model order) and
    its `VllmConfig`, with `available_bytes` of GPU memory for the KV cache.

    With HiSparse and `host_pool_bytes=None` the host budget is what vLLM's planner reads:
    `vllm.v1.core.kv_cache_planning.get_hisparse_host_pool_bytes(vllm_config)`. A spec type or
    engine mode the contract cannot express raises `UnsupportedRequestError` (a `PlanError`)
    naming it; inputs that are not vLLM's objects are a PlanError too.

    Layers that read another layer's cache (vLLM's `kv_sharing_target_layer_name`) have no spec
    in `kv_cache_specs`: `shared_kv_cache_layers` (vLLM's `get_shared_kv_cache_layers`) names
    them and their targets, read off `vllm_config`'s attention layers when not given; each
    enters the request as its target's layer with `kv_sharing_target`.

    On CUDA the request names the GPU vLLM's platform reports (`device.compute_capability`),
    so planning it holds the plan to the stride rules of the kernels vLLM runs there; off CUDA
    it names none (set it to plan for a GPU this process is not on).
    """
    if not isinstance(kv_cache_specs, Mapping):
        raise PlanError(
            f"kv_cache_specs: expected vLLM's dict of layer name to KVCacheSpec, got "
            f"{type(kv_cache_specs).__name__}", field="layers",
        )
    if not kv_cache_specs:
        raise UnsupportedRequestError(
            "kv_cache_specs: the model has no KV cache layers (attention-free); expected at "
            "least one", field="layers",
        )
    try:
        settings = settings_from_vllm(vllm_config, host_pool_bytes)
    except AttributeError as error:
        # Read by attribute, as vLLM's own planner reads it: an object without one of them
        # is not a VllmConfig.
        raise PlanError(
            f"vllm_config: expected a VllmConfig of vLLM 0.33 or 0.34, got "
            f"{type(vllm_config).__name__}, which lacks what vLLM's has ({error})",
            field="vllm_config",
        ) from None
    shared = (kv_sharing.shared_kv_cache_layers(vllm_config) if shared_kv_cache_layers is None
              else dict(shared_kv_cache_layers))
    settings = replace(settings, compute_capability=engine_capability())
    return request_from_settings(kv_cache_specs, settings, available_bytes, shared)


def install_builder() -> None:
    """Make vLLM plan through hisparse_plan in this process: the current platform's
    `get_kv_cache_config_builder_cls` answers `BUILDER_QUALNAME`."""
    platforms = importlib.import_module("vllm.platforms")
    platform_cls = type(platforms.current_platform)

    def builder_cls(cls: type, vllm_config: VllmObject) -> str:
        del cls, vllm_config
        return BUILDER_QUALNAME

    platform_cls.get_kv_cache_config_builder_cls = classmethod(builder_cls)


def register() -> None:
    """vLLM general-plugin hook (runs in every vLLM process): installs the builder when
    HISPARSE_PLAN_VLLM_BUILDER=1, so installing the extra alone changes nothing."""
    if os.environ.get(PLUGIN_SWITCH) == "1":
        install_builder()
