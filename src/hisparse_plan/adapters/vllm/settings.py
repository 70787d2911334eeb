"""What a vLLM engine config says about planning, and the request it makes (SPEC 4, 4.1).

`EngineSettings` is plain data, so building a request from it needs no vLLM; only
`settings_from_vllm` reads a `VllmConfig`, and it asks vLLM's own helpers (looked up at call time)
for the figures vLLM derives: the host pool budget, the decode query length, the shared pool.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass

from hisparse_plan.adapters.vllm.layers import layer_dicts
from hisparse_plan.adapters.vllm.types import VllmObject
from hisparse_plan.errors import UnsupportedRequestError
from hisparse_plan.models import PlanRequest
from hisparse_plan.models.base import GIB


@dataclass(frozen=True, slots=True)
class HisparseSettings:
    host_pool_bytes: int
    device_buffer_size: int | None
    max_decode_query_len: int
    shared_host_pool: bool


@dataclass(frozen=True, slots=True)
class EngineSettings:
    """The engine figures a plan request takes, as vLLM resolves them."""

    max_model_len: int
    index_topk: int | None
    auto_fit_max_model_len: bool
    kv_cache_layout: str
    num_blocks_override: int | None
    max_num_batched_tokens: int
    max_concurrent_batches: int
    num_prefill_lookahead_tokens: int
    hisparse: HisparseSettings | None

    @property
    def extra_window_tokens(self) -> int:
        return max(0, self.num_prefill_lookahead_tokens - 1)


def request_dict(
    specs: Mapping[str, VllmObject], settings: EngineSettings, available_bytes: int
) -> dict[str, object]:
    """The request of SPEC 4 / 4.1 as JSON-shaped data. Equal layers share one dict: copy a
    layer's dict before changing it."""
    hisparse = settings.hisparse
    return {
        "layers": layer_dicts(specs, settings.extra_window_tokens),
        "model": {
            "max_model_len": settings.max_model_len,
            "index_topk": settings.index_topk,
            "auto_fit_max_model_len": settings.auto_fit_max_model_len,
        },
        "hisparse": None if hisparse is None else {
            # Exact: a byte count below 2**53 divided by 2**30 and multiplied back is itself.
            "host_pool_gib": hisparse.host_pool_bytes / GIB,
            "device_buffer_size": hisparse.device_buffer_size,
            "max_decode_query_len": hisparse.max_decode_query_len,
            "shared_host_pool": hisparse.shared_host_pool,
        },
        "device": {
            "available_bytes": available_bytes,
            "kv_cache_layout": settings.kv_cache_layout,
            "num_blocks_override": settings.num_blocks_override,
        },
        "scheduler": {
            "max_num_batched_tokens": settings.max_num_batched_tokens,
            "max_concurrent_batches": settings.max_concurrent_batches,
            "num_prefill_lookahead_tokens": settings.num_prefill_lookahead_tokens,
        },
    }


def settings_from_vllm(
    vllm_config: VllmObject, host_pool_bytes: int | None = None
) -> EngineSettings:
    """Read a `VllmConfig` (or an object with the same attributes) the way vLLM 0.33 plans."""
    _refuse_unsupported(vllm_config)
    model = vllm_config.model_config
    cache = vllm_config.cache_config
    hisparse_config = vllm_config.attention_config.hisparse_config
    hisparse = None
    if hisparse_config is not None:
        layout_module = importlib.import_module("vllm.v1.hisparse.layout")
        backend = importlib.import_module("vllm.v1.attention.backend")
        if host_pool_bytes is None:
            host_pool_bytes = int(layout_module.get_hisparse_host_pool_bytes(vllm_config))
        hisparse = HisparseSettings(
            host_pool_bytes=host_pool_bytes,
            device_buffer_size=hisparse_config.device_buffer_size,
            max_decode_query_len=int(backend.max_decode_query_len(vllm_config)),
            shared_host_pool=bool(layout_module.use_shared_hisparse_host_pool(vllm_config)),
        )
    return EngineSettings(
        max_model_len=model.max_model_len,
        index_topk=getattr(model.hf_config, "index_topk", None),
        auto_fit_max_model_len=getattr(model, "original_max_model_len", None) == -1,
        kv_cache_layout=cache.get_resolved_kv_cache_layout().name,
        num_blocks_override=cache.num_gpu_blocks_override,
        max_num_batched_tokens=vllm_config.scheduler_config.max_num_batched_tokens,
        max_concurrent_batches=vllm_config.max_concurrent_batches,
        num_prefill_lookahead_tokens=vllm_config.num_prefill_lookahead_tokens,
        hisparse=hisparse,
    )


def _refuse_unsupported(vllm_config: VllmObject) -> None:
    """Engine modes SPEC 7.11 defers: refuse them instead of planning something else."""
    checks = (
        ("scheduler_config.disable_hybrid_kv_cache_manager",
         vllm_config.scheduler_config.disable_hybrid_kv_cache_manager, False),
        ("cache_config.mamba_cache_mode",
         getattr(vllm_config.cache_config, "mamba_cache_mode", "none"), "none"),
        ("parallel_config.decode_context_parallel_size",
         vllm_config.parallel_config.decode_context_parallel_size, 1),
        ("model_config.supports_kv_cache_grouping",
         bool(getattr(vllm_config.model_config, "supports_kv_cache_grouping", False)), False),
    )
    for field, value, expected in checks:
        if value != expected:
            raise UnsupportedRequestError(
                f"vllm_config.{field}: expected {expected!r}, got {value!r}; this mode is "
                "deferred (SPEC 7.11)",
                field=f"vllm_config.{field}",
            )


def request_from_settings(
    specs: Mapping[str, VllmObject], settings: EngineSettings, available_bytes: int
) -> PlanRequest:
    return PlanRequest.model_validate(request_dict(specs, settings, available_bytes))
