"""The operator's choices (Settings), a preset's defaults, and the request sections every
model shares (model, device with its pipeline stages, scheduler)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any, Final, Literal, get_args

from hisparse_plan.models import KVCacheLayout, SchedulerConfig
from hisparse_plan.models.base import GIB
from hisparse_plan.models.entry_input import did_you_mean
from hisparse_plan.presets.errors import ConfigError
from hisparse_plan.presets.kv_dtypes import KVDtype
from hisparse_plan.presets.stages import stage_layers

EXACT_FLOAT_BYTES: Final = 2**53
"""Below this, bytes / 2**30 is an exact float and int(gib * 2**30) gives the bytes back."""

Speculative = Literal["mtp"]
VllmVersion = Literal["0.33", "0.34"]
VLLM_VERSIONS: Final[tuple[VllmVersion, ...]] = ("0.33", "0.34")
DEFAULT_VLLM: Final[VllmVersion] = "0.34"
HostPoolLayout = Literal["layer_outermost", "block_outermost"]
HOST_POOL_LAYOUTS: Final = get_args(HostPoolLayout)
VLLM_BLOCK_SIZE: Final[dict[VllmVersion, int]] = {"0.33": 16, "0.34": 64}
"""vLLM's CacheConfig.DEFAULT_BLOCK_SIZE, which its attention backends keep."""


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
    hisparse: bool | None = None
    """False plans a sparse-MLA model without HiSparse: every cache a regular layer."""
    pp: int | None = None
    """Pipeline stages: decoder layers split as vLLM's get_pp_indices splits them."""
    stage_gpu_mem_bytes: tuple[int, ...] | None = None
    """KV-cache bytes of each pipeline stage (else gpu_mem_bytes for every stage)."""
    auto_fit: bool | None = None
    """Let the plan shorten max_model_len to what fits (see docs/planning-rules.md#auto-fit)."""
    speculative: Speculative | None = None
    """"mtp": the model's next-n (MTP) draft layers join the plan."""
    vllm: VllmVersion | None = None
    """The vLLM release whose defaults the plan takes (block size); default 0.34."""
    prefix_caching: bool | None = None
    """vLLM's prefix caching (on by default): Mamba hybrids then cache states in align mode."""
    hybrid_kv_cache_manager: bool | None = None
    """vLLM's hybrid KV cache manager; None: vLLM's default (off for chunked-local models)."""
    dcp: int | None = None
    """Decode context parallel ranks (vLLM's -dcp), out of the tensor-parallel ones."""
    host_pool_layout: HostPoolLayout | None = None
    """HiSparse's host pool placement: layer_outermost (vLLM's) or block_outermost (see
    docs/transfer.md#placement-that-transfers-well)."""

    def __post_init__(self) -> None:
        check_settings(self)

    def given(self) -> dict[str, Any]:
        """The fields that were set."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return {name: value for name, value in values.items() if value is not None}


LEAST: Final[dict[str, int]] = {
    "block_size": 1, "max_model_len": 1, "gpu_mem_bytes": 0, "host_pool_bytes": 1,
    "device_buffer_size": 1, "spec_tokens": 0, "tp": 1, "max_num_batched_tokens": 1,
    "max_concurrent_batches": 1, "pp": 1, "dcp": 1,
}
"""The least value of each integer setting: what the request field it becomes accepts (a
byte count of GPU memory may be 0; a host pool holds at least a byte)."""


def check_settings(settings: Settings) -> None:
    """Each integer setting an integer no less than its `LEAST`, refused naming the Settings
    field (the request field it would become is the caller's business, not theirs)."""
    for name, least in LEAST.items():
        _check_int(f"Settings.{name}", name, getattr(settings, name), least)
    layout = settings.host_pool_layout
    if layout is not None and layout not in HOST_POOL_LAYOUTS:
        raise ConfigError(
            f"Settings.host_pool_layout: expected one of {', '.join(HOST_POOL_LAYOUTS)}, got "
            f"{layout!r}", field="host_pool_layout",
        )
    stages = settings.stage_gpu_mem_bytes
    if stages is not None:
        if not isinstance(stages, tuple):
            raise ConfigError(
                f"Settings.stage_gpu_mem_bytes: expected a tuple of byte counts, one per "
                f"pipeline stage, got {type(stages).__name__}",
                field="stage_gpu_mem_bytes",
            )
        for index, nbytes in enumerate(stages):
            _check_int(f"Settings.stage_gpu_mem_bytes[{index}]", "stage_gpu_mem_bytes", nbytes,
                       0)


def _check_int(where: str, field: str, value: object, least: int) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where}: expected an integer, got {value!r}", field=field)
    if value < least:
        raise ConfigError(f"{where}: expected an integer >= {least}, got {value}", field=field)


SETTINGS_SPELLINGS: Final[dict[str, str]] = {
    "gpu_mem": "gpu_mem_bytes",
    "gpu_memory_utilization": "gpu_mem_bytes (bytes for the KV cache, not a fraction)",
    "kv_cache_memory_bytes": "gpu_mem_bytes",
    "host_pool_gib": "host_pool_bytes (bytes)",
    "host_pool": "host_pool_bytes",
    "kv_cache_dtype": "kv_dtype",
    "tensor_parallel_size": "tp",
    "pipeline_parallel_size": "pp",
    "decode_context_parallel_size": "dcp",
    "num_speculative_tokens": "spec_tokens",
    "kv_cache_layout": "layout",
    "enable_prefix_caching": "prefix_caching",
    "enable_hisparse": "hisparse",
    "max_num_seqs": "max_concurrent_batches",
}
"""The CLI's and vLLM's names for a Settings field, normalized (see `normal_key`)."""


def _checked_init(init: Callable[..., None]) -> Callable[..., None]:
    """Settings' generated __init__, with a keyword it does not take refused as a ConfigError
    naming the field meant (a CLI or vLLM spelling), instead of Python's TypeError."""

    @functools.wraps(init)
    def checked(self: Settings, *args: object, **kwargs: object) -> None:
        names = [f.name for f in fields(Settings)]
        for key in kwargs:
            if key not in names:
                hint = did_you_mean(key, SETTINGS_SPELLINGS, names)
                meant = f"did you mean {hint}? " if hint else ""
                raise ConfigError(
                    f"Settings.{key}: not a Settings field; {meant}(expected one of "
                    f"{', '.join(names)})", field=key,
                )
        init(self, *args, **kwargs)

    return checked


Settings.__init__ = _checked_init(Settings.__init__)  # type: ignore[method-assign]

NO_SETTINGS: Final = Settings()
"""Nothing chosen: every default."""

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
"""A sparse-MLA preset's defaults; max_model_len defaults to the model's
max_position_embeddings. Regular presets take the same memory, layout and scheduler, but
16-token blocks and bfloat16 (vLLM's defaults for attention layers)."""

LAYER_SHAPING: Final = ("kv_dtype", "block_size", "hisparse", "pp", "speculative")
"""Settings that change the layers or stages, which a request file fixes."""


def vllm_version(settings: Settings) -> VllmVersion:
    return settings.vllm or DEFAULT_VLLM


def default_block_size(settings: Settings) -> int:
    """The attention block size: the chosen one, else the vLLM version's default."""
    return settings.block_size or VLLM_BLOCK_SIZE[vllm_version(settings)]


def context_parallel(settings: Settings) -> int:
    """The decode context parallel size, which must divide the tensor-parallel ranks (vLLM
    carves the DCP ranks out of them)."""
    dcp, tp = settings.dcp or 1, settings.tp or 1
    if tp % dcp:
        raise ConfigError(
            f"dcp: decode context parallel ranks come out of the tensor-parallel ones: expected "
            f"a divisor of tp {tp}, got {dcp}",
            field="dcp",
        )
    return dcp


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


def model_section(max_model_len: int, settings: Settings, index_topk: int | None) -> dict[str, Any]:
    section: dict[str, Any] = {"max_model_len": max_model_len}
    if index_topk is not None:
        section["index_topk"] = index_topk
    if settings.auto_fit:
        section["auto_fit_max_model_len"] = True
    return section


def device_section(
    settings: Settings, base: dict[str, Any], decoder_layers: Sequence[Sequence[str]] = ()
) -> dict[str, Any]:
    """The device section; with `pp` > 1, one pipeline stage per get_pp_indices partition of
    `decoder_layers` (each decoder layer's cache layers, in model order)."""
    section = dict(base)
    if settings.gpu_mem_bytes is not None:
        section["available_bytes"] = settings.gpu_mem_bytes
    if settings.layout is not None:
        section["kv_cache_layout"] = settings.layout.value
    section.setdefault("num_blocks_override", None)
    pp = settings.pp or 1
    if settings.stage_gpu_mem_bytes is not None and len(settings.stage_gpu_mem_bytes) != pp:
        raise ConfigError(
            f"stage memory: expected one size per pipeline stage ({pp}), got "
            f"{len(settings.stage_gpu_mem_bytes)}",
            field="device.pipeline_stages",
        )
    if pp > 1:
        memory = settings.stage_gpu_mem_bytes or (section["available_bytes"],) * pp
        section["pipeline_stages"] = [
            {"layers": layers, "available_bytes": nbytes}
            for layers, nbytes in zip(stage_layers(decoder_layers, pp), memory, strict=True)
        ]
        # Each stage brings its own memory; the single-stage figure is unused (see
        # docs/planning-rules.md#requests).
        section["available_bytes"] = 0
    return section


def scheduler_section(
    settings: Settings,
    base: dict[str, Any],
    lookahead: int | None = None,
    *,
    chunked_local: bool = False,
) -> dict[str, Any]:
    """The scheduler section; vLLM disables the hybrid KV cache manager for a model with
    chunked-local layers unless it is asked to keep it (`chunked_local`)."""
    section = dict(base)
    manager = settings.hybrid_kv_cache_manager
    if manager is False or (manager is None and chunked_local):
        section["disable_hybrid_kv_cache_manager"] = True
    elif manager:
        section.pop("disable_hybrid_kv_cache_manager", None)
    dcp = context_parallel(settings)
    if dcp > 1 or settings.dcp is not None:
        section["decode_context_parallel_size"] = dcp
    if settings.max_num_batched_tokens is not None:
        section["max_num_batched_tokens"] = settings.max_num_batched_tokens
    if settings.max_concurrent_batches is not None:
        section["max_concurrent_batches"] = settings.max_concurrent_batches
    if lookahead:
        section["num_prefill_lookahead_tokens"] = lookahead
    return section
