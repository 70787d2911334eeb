"""Turning a model's architecture and the operator's choices into a plan request.

Layer names follow vLLM's for DeepSeek-style models: `model.layers.{i}.self_attn.attn` for the
latent (sparse) cache and `model.layers.{i}.self_attn.indexer.k_cache` for the indexer keys,
each layer's indexer right after its sparse layer. MTP draft layers (the config's
`num_nextn_predict_layers`) are decoder layers `num_hidden_layers`, `num_hidden_layers + 1`,
... of the draft model, named the same way, as vLLM's DeepSeek MTP model registers them; each
runs its own indexer (vLLM builds one for every MTP layer, whatever the index sharing).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Final

from hisparse_plan.models import PlanRequest
from hisparse_plan.models.entry_input import refuse_preset
from hisparse_plan.presets.architecture import ModelArchitecture
from hisparse_plan.presets.deepseek_v4_request import build_deepseek_v4_request
from hisparse_plan.presets.errors import ConfigError
from hisparse_plan.presets.kv_dtypes import row_geometry
from hisparse_plan.presets.regular import RegularArchitecture
from hisparse_plan.presets.regular_request import build_regular_request
from hisparse_plan.presets.settings import (
    DEFAULTS,
    LAYER_SHAPING,
    NO_SETTINGS,
    Settings,
    context_length,
    device_section,
    host_pool_gib,
    model_section,
    scheduler_section,
    shared_host_pool,
)
from hisparse_plan.presets.speculative import mtp_plan

SPARSE_LAYER: Final = "model.layers.{}.self_attn.attn"
INDEXER_LAYER: Final = "model.layers.{}.self_attn.indexer.k_cache"
HISPARSE_ONLY: Final = ("host_pool_bytes", "device_buffer_size")

Architecture = ModelArchitecture | RegularArchitecture


def build_request(arch: Architecture, settings: Settings = NO_SETTINGS) -> PlanRequest:
    """A request for `arch`: the preset defaults overlaid with `settings`."""
    refuse_preset(arch, "build_request", "a model architecture")
    if not isinstance(settings, Settings):
        raise ConfigError(f"build_request: expected Settings, got {type(settings).__name__}",
                          field="settings")
    if isinstance(arch, RegularArchitecture):
        if arch.compressed_mla:
            return build_deepseek_v4_request(arch, settings)
        return build_regular_request(arch, settings)
    chosen = replace(DEFAULTS, **settings.given())
    with_hisparse = chosen.hisparse is not False
    if not with_hisparse:
        for name in HISPARSE_ONLY:
            if getattr(settings, name) is not None:
                raise ConfigError(
                    f"{name}: a HiSparse setting, but HiSparse is off (--no-hisparse); "
                    "expected it unset",
                    field=name,
                )
    geometry = row_geometry(arch, chosen.kv_dtype or "fp8_ds_mla")
    sparse: dict[str, Any] = {
        "kind": "mla",
        "block_size": chosen.block_size,
        "head_size": geometry.head_size,
        "dtype": geometry.dtype,
    }
    if geometry.state_content_bytes is not None:
        sparse["cache_dtype"] = geometry.kv_dtype
        sparse["state_content_bytes"] = geometry.state_content_bytes
    sparse["cache_role"] = "sparse"
    indexer = {
        "kind": "mla",
        "block_size": chosen.block_size,
        "head_size": geometry.indexer_head_size,
        "dtype": geometry.indexer_dtype,
        "cache_role": "indexer",
    }
    mtp = mtp_plan(chosen, arch.num_nextn_predict_layers)
    leaders = arch.leaders() + [True] * mtp.layers
    decoder_layers: list[dict[str, Any]] = []
    for i, leader in enumerate(leaders):
        layer = {SPARSE_LAYER.format(i): {**sparse, "is_index_group_leader": leader}}
        if leader:
            layer[INDEXER_LAYER.format(i)] = indexer
        decoder_layers.append(layer)
    max_model_len = context_length(arch.max_position_embeddings, chosen)
    index_topk = arch.index_topk if with_hisparse else None
    return PlanRequest.model_validate(
        {
            "layers": {name: spec for layer in decoder_layers for name, spec in layer.items()},
            "model": model_section(max_model_len, chosen, index_topk),
            "hisparse": _hisparse(replace(chosen, spec_tokens=mtp.tokens), {})
            if with_hisparse else None,
            "device": device_section(
                chosen, {}, [list(layer) for layer in decoder_layers[: arch.num_hidden_layers]]
            ),
            "scheduler": scheduler_section(chosen, {}, mtp.lookahead),
        }
    )


def override_request(request: PlanRequest, settings: Settings) -> PlanRequest:
    """`request` with the settings that were given replacing its own values.

    The layers are the request's own, so nothing that shapes them (kv_dtype, block_size,
    HiSparse on or off, pipeline stages, MTP layers) can be changed here.
    """
    for name in LAYER_SHAPING:
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
    if settings.auto_fit is not None:
        data["model"]["auto_fit_max_model_len"] = settings.auto_fit
    if data["hisparse"] is not None or _touches_hisparse(settings):
        data["hisparse"] = _hisparse(settings, data["hisparse"] or {})
    data["device"] = device_section(settings, data["device"])
    data["scheduler"] = scheduler_section(settings, data["scheduler"])
    return PlanRequest.model_validate(data)


def _touches_hisparse(settings: Settings) -> bool:
    """Settings that only a HiSparse section holds. `tp` is not one: on a regular request it
    changes nothing (its layers are already one rank's), and on a HiSparse one it only sets
    the pool's sharing."""
    return any(
        value is not None
        for value in (
            settings.host_pool_bytes, settings.device_buffer_size, settings.spec_tokens,
            settings.host_pool_layout,
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
    if settings.host_pool_layout is not None:
        section["host_pool_layout"] = settings.host_pool_layout
    return section
