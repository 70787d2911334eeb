"""What a vLLM engine config says about planning, and the request it makes (SPEC 4, 4.1).

`EngineSettings` is plain data, so building a request from it needs no vLLM; only
`settings_from_vllm` reads a `VllmConfig` (0.33 or 0.34), and it asks vLLM's own helpers (looked
up at call time, so a monkeypatch on their module applies) for the figures vLLM derives: the host
pool budget (`vllm.v1.core.kv_cache_planning.get_hisparse_host_pool_bytes`, the binding vLLM's
planner calls), the decode query length (`vllm.v1.attention.backend.max_decode_query_len`: 1 + K
on 0.33, 1 + K + max_num_new_slots_for_drafting on 0.34) and the shared pool
(`vllm.v1.hisparse.layout.use_shared_hisparse_host_pool`, which 0.34 answers through the platform's
HiSparse backend).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast

from hisparse_plan.adapters.vllm.kv_sharing import with_shared_layers
from hisparse_plan.adapters.vllm.layers import LayerDict, layer_dicts
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
    mamba_cache_mode: str = "none"
    disable_hybrid_kv_cache_manager: bool = False
    decode_context_parallel_size: int = 1
    compute_capability: tuple[int, int] | None = None
    """The CUDA GPU vLLM runs on (None: not known, e.g. off CUDA)."""

    @property
    def extra_window_tokens(self) -> int:
        return max(0, self.num_prefill_lookahead_tokens - 1)


def request_dict(
    specs: Mapping[str, VllmObject], settings: EngineSettings, available_bytes: int
) -> dict[str, object]:
    """The plan request (docs/planning-rules.md#requests) as JSON-shaped data. Equal layers
    share one dict: copy a layer's dict before changing it.

    The engine modes vLLM runs by default are written only when they differ from the request's
    defaults, so a request for a deployment that uses none of them reads as it always did.
    """
    hisparse = settings.hisparse
    model: dict[str, object] = {
        "max_model_len": settings.max_model_len,
        "index_topk": settings.index_topk,
        "auto_fit_max_model_len": settings.auto_fit_max_model_len,
    }
    if settings.mamba_cache_mode != "none":
        model["mamba_cache_mode"] = settings.mamba_cache_mode
    scheduler: dict[str, object] = {
        "max_num_batched_tokens": settings.max_num_batched_tokens,
        "max_concurrent_batches": settings.max_concurrent_batches,
        "num_prefill_lookahead_tokens": settings.num_prefill_lookahead_tokens,
    }
    if settings.disable_hybrid_kv_cache_manager:
        scheduler["disable_hybrid_kv_cache_manager"] = True
    if settings.decode_context_parallel_size != 1:
        scheduler["decode_context_parallel_size"] = settings.decode_context_parallel_size
    device: dict[str, object] = {
        "available_bytes": available_bytes,
        "kv_cache_layout": settings.kv_cache_layout,
        "num_blocks_override": settings.num_blocks_override,
    }
    if settings.compute_capability is not None:
        device["compute_capability"] = list(settings.compute_capability)
    return {
        "layers": layer_dicts(specs, settings.extra_window_tokens),
        "model": model,
        "hisparse": None if hisparse is None else {
            # Exact: a byte count below 2**53 divided by 2**30 and multiplied back is itself.
            "host_pool_gib": hisparse.host_pool_bytes / GIB,
            "device_buffer_size": hisparse.device_buffer_size,
            "max_decode_query_len": hisparse.max_decode_query_len,
            "shared_host_pool": hisparse.shared_host_pool,
        },
        "device": device,
        "scheduler": scheduler,
    }


def settings_from_vllm(
    vllm_config: VllmObject, host_pool_bytes: int | None = None
) -> EngineSettings:
    """Read a `VllmConfig` of vLLM 0.33 or 0.34 (or an object with the same attributes) the way
    that version plans."""
    _refuse_unsupported(vllm_config)
    model = vllm_config.model_config
    cache = vllm_config.cache_config
    hisparse_config = vllm_config.attention_config.hisparse_config
    hisparse = None
    if hisparse_config is not None:
        backend = importlib.import_module("vllm.v1.attention.backend")
        if host_pool_bytes is None:
            host_pool_bytes = hisparse_host_budget(vllm_config)
        hisparse = HisparseSettings(
            host_pool_bytes=host_pool_bytes,
            device_buffer_size=hisparse_config.device_buffer_size,
            max_decode_query_len=int(backend.max_decode_query_len(vllm_config)),
            shared_host_pool=shared_host_pool(vllm_config),
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
        mamba_cache_mode=getattr(cache, "mamba_cache_mode", "none"),
        disable_hybrid_kv_cache_manager=bool(
            vllm_config.scheduler_config.disable_hybrid_kv_cache_manager
        ),
        decode_context_parallel_size=vllm_config.parallel_config.decode_context_parallel_size,
    )


def hisparse_host_budget(vllm_config: VllmObject) -> int:
    """The HiSparse host budget in bytes, through the binding vLLM's own planner calls
    (`vllm.v1.core.kv_cache_planning.get_hisparse_host_pool_bytes`, read at call time so a
    monkeypatch of that module's name reaches us as it reaches vLLM)."""
    planning = importlib.import_module("vllm.v1.core.kv_cache_planning")
    return int(planning.get_hisparse_host_pool_bytes(vllm_config))


def shared_host_pool(vllm_config: VllmObject) -> bool:
    """vLLM's own choice (0.34 asks the platform's HiSparse backend whether it can share)."""
    layout_module = importlib.import_module("vllm.v1.hisparse.layout")
    return bool(layout_module.use_shared_hisparse_host_pool(vllm_config))


MAMBA_CACHE_MODES = ("none", "align")
"""The Mamba cache modes the contract plans; vLLM's others (e.g. "all") are refused."""


def _refuse_unsupported(vllm_config: VllmObject) -> None:
    """Engine modes the contract still defers: refuse them instead of planning something else."""
    mamba_mode = getattr(vllm_config.cache_config, "mamba_cache_mode", "none")
    if mamba_mode not in MAMBA_CACHE_MODES:
        raise UnsupportedRequestError(
            f"vllm_config.cache_config.mamba_cache_mode: expected one of "
            f"{', '.join(map(repr, MAMBA_CACHE_MODES))}, got {mamba_mode!r}; this mode is not "
            "planned by hisparse_plan",
            field="vllm_config.cache_config.mamba_cache_mode",
        )
    grouping = bool(getattr(vllm_config.model_config, "supports_kv_cache_grouping", False))
    if grouping:
        raise UnsupportedRequestError(
            "vllm_config.model_config.supports_kv_cache_grouping: expected False, got True; a "
            "model that declares its own KV cache grouping is not planned by hisparse_plan",
            field="vllm_config.model_config.supports_kv_cache_grouping",
        )


def request_from_settings(
    specs: Mapping[str, VllmObject], settings: EngineSettings, available_bytes: int,
    shared: Mapping[str, str] | None = None,
) -> PlanRequest:
    """The request; `shared` (sharing layer -> target) adds the layers vLLM gave no spec."""
    data = request_dict(specs, settings, available_bytes)
    if shared:
        data["layers"] = with_shared_layers(cast("dict[str, LayerDict]", data["layers"]), shared)
    return PlanRequest.model_validate(data)
