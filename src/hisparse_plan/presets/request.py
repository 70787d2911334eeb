"""Turning a model's architecture and the operator's choices into a plan request.

Layer names follow vLLM's for DeepSeek-style models: `model.layers.{i}.self_attn.attn` for the
latent (sparse) cache and `model.layers.{i}.self_attn.indexer.k_cache` for the indexer keys,
each layer's indexer right after its sparse layer.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Final

from hisparse_plan.models import KVCacheLayout, PlanRequest, SchedulerConfig
from hisparse_plan.presets.architecture import ModelArchitecture
from hisparse_plan.presets.errors import ConfigError
from hisparse_plan.presets.kv_dtypes import KVDtype, row_geometry

GIB: Final = 2**30
SPARSE_LAYER: Final = "model.layers.{}.self_attn.attn"
INDEXER_LAYER: Final = "model.layers.{}.self_attn.indexer.k_cache"
EXACT_FLOAT_BYTES: Final = 2**53
"""Below this, bytes / 2**30 is an exact float and int(gib * 2**30) gives the bytes back."""


@dataclass(frozen=True, slots=True)
class Settings:
    """The operator's choices; None keeps the default (for a preset) or the request's value."""

    kv_dtype: KVDtype | None = None
    block_size: int | None = None
    max_model_len: int | None = None
    gpu_mem_bytes: int | None = None
    host_pool_bytes: int | None = None
    device_buffer_size: int | None = None
    spec_tokens: int | None = None
    layout: KVCacheLayout | None = None
    tp: int | None = None
    max_num_batched_tokens: int | None = None
    max_concurrent_batches: int | None = None
    allow_long_context: bool | None = None
    """Plan a max_model_len above the model's max_position_embeddings (refused otherwise)."""

    def given(self) -> dict[str, Any]:
        """The fields that were set."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return {name: value for name, value in values.items() if value is not None}


DEFAULTS: Final = Settings(
    kv_dtype="fp8_ds_mla",
    block_size=64,
    gpu_mem_bytes=60 * GIB,
    host_pool_bytes=64 * GIB,
    spec_tokens=0,
    layout=KVCacheLayout.BLNHC,
    tp=1,
    max_num_batched_tokens=SchedulerConfig().max_num_batched_tokens,
    max_concurrent_batches=SchedulerConfig().max_concurrent_batches,
)
"""A preset's defaults; max_model_len defaults to the model's max_position_embeddings."""


def host_pool_gib(host_pool_bytes: int) -> float:
    """The `host_pool_gib` whose budget, int(gib * 2**30), is exactly `host_pool_bytes`."""
    if not 0 < host_pool_bytes < EXACT_FLOAT_BYTES:
        raise ConfigError(
            f"host pool: expected between 1 byte and 8 PiB, got {host_pool_bytes} bytes",
            field="hisparse.host_pool_gib",
        )
    return host_pool_bytes / GIB


def shared_host_pool(tp: int) -> bool:
    """TP ranks on one node map one host pool: with more than one rank it is shared."""
    return tp > 1


def build_request(arch: ModelArchitecture, settings: Settings = Settings()) -> PlanRequest:
    """A request for `arch`: DEFAULTS overlaid with `settings`."""
    chosen = replace(DEFAULTS, **settings.given())
    kv_dtype = chosen.kv_dtype or "fp8_ds_mla"
    geometry = row_geometry(arch, kv_dtype)
    block_size = chosen.block_size
    sparse: dict[str, Any] = {
        "kind": "mla",
        "block_size": block_size,
        "head_size": geometry.head_size,
        "dtype": geometry.dtype,
    }
    if geometry.state_content_bytes is not None:
        sparse["cache_dtype"] = kv_dtype
        sparse["state_content_bytes"] = geometry.state_content_bytes
    sparse["cache_role"] = "sparse"
    indexer = {
        "kind": "mla",
        "block_size": block_size,
        "head_size": geometry.indexer_head_size,
        "dtype": geometry.indexer_dtype,
        "cache_role": "indexer",
    }
    max_model_len = context_length(arch.max_position_embeddings, chosen)
    layers: dict[str, Any] = {}
    for i, leader in enumerate(arch.leaders()):
        layers[SPARSE_LAYER.format(i)] = {**sparse, "is_index_group_leader": leader}
        if leader:
            layers[INDEXER_LAYER.format(i)] = indexer
    return PlanRequest.model_validate(
        {
            "layers": layers,
            "model": {
                "max_model_len": max_model_len,
                "index_topk": arch.index_topk,
            },
            "hisparse": _hisparse(chosen, {}),
            "device": _device(chosen, {}),
            "scheduler": _scheduler(chosen, {}),
        }
    )


def context_length(max_position_embeddings: int, settings: Settings) -> int:
    """The max_model_len to plan: the chosen one, else the model's max_position_embeddings.

    A length past max_position_embeddings is refused unless `allow_long_context` is set: the
    model was not trained for it (vLLM likewise refuses it unless told to allow it)."""
    wanted = settings.max_model_len
    if wanted is None:
        return max_position_embeddings
    if wanted > max_position_embeddings and not settings.allow_long_context:
        raise ConfigError(
            f"model.max_model_len: expected at most the model's max_position_embeddings "
            f"({max_position_embeddings}), got {wanted}; pass --allow-long-context "
            "(Settings(allow_long_context=True)) to plan it anyway",
            field="model.max_model_len",
        )
    return wanted


def override_request(request: PlanRequest, settings: Settings) -> PlanRequest:
    """`request` with the settings that were given replacing its own values.

    The layers are the request's own, so a kv_dtype or block_size cannot be changed here.
    """
    for name in ("kv_dtype", "block_size"):
        if getattr(settings, name) is not None:
            raise ConfigError(
                f"{name} shapes the layers, which a request file fixes; change its layers, or "
                "plan a model preset or a config.json instead",
                field=name,
            )
    if not settings.given():
        return request
    data = request.model_dump(mode="json")
    if settings.max_model_len is not None:
        data["model"]["max_model_len"] = settings.max_model_len
    if data["hisparse"] is not None or _touches_hisparse(settings):
        data["hisparse"] = _hisparse(settings, data["hisparse"] or {})
    data["device"] = _device(settings, data["device"])
    data["scheduler"] = _scheduler(settings, data["scheduler"])
    return PlanRequest.model_validate(data)


def _touches_hisparse(settings: Settings) -> bool:
    return any(
        value is not None
        for value in (
            settings.host_pool_bytes, settings.device_buffer_size, settings.spec_tokens,
            settings.tp,
        )
    )


def _hisparse(settings: Settings, base: dict[str, Any]) -> dict[str, Any]:
    section = dict(base)
    if settings.host_pool_bytes is not None:
        section["host_pool_gib"] = host_pool_gib(settings.host_pool_bytes)
    if settings.device_buffer_size is not None:
        section["device_buffer_size"] = settings.device_buffer_size
    section.setdefault("device_buffer_size", None)
    if settings.spec_tokens is not None:
        section["max_decode_query_len"] = 1 + settings.spec_tokens
    if settings.tp is not None:
        section["shared_host_pool"] = shared_host_pool(settings.tp)
    return section


def _device(settings: Settings, base: dict[str, Any]) -> dict[str, Any]:
    section = dict(base)
    if settings.gpu_mem_bytes is not None:
        section["available_bytes"] = settings.gpu_mem_bytes
    if settings.layout is not None:
        section["kv_cache_layout"] = settings.layout.value
    section.setdefault("num_blocks_override", None)
    return section


def _scheduler(settings: Settings, base: dict[str, Any]) -> dict[str, Any]:
    section = dict(base)
    if settings.max_num_batched_tokens is not None:
        section["max_num_batched_tokens"] = settings.max_num_batched_tokens
    if settings.max_concurrent_batches is not None:
        section["max_concurrent_batches"] = settings.max_concurrent_batches
    return section
