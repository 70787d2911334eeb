"""SGLang requests: a model's per-rank layers (read as the project reads any config.json or
preset, at SGLang's tensor-parallel size, then kept as SGLang 0.5.23 keeps them for the model's
family: `presets.families`' `SGLangRule`) with SGLang's server settings as the request's
`engine`; and SGLang's server arguments, as a reference case spells them, turned into those
settings."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from pydantic import ValidationError

from hisparse_plan.adapters.sglang.draft import draft_settings
from hisparse_plan.adapters.sglang.server_args_checks import (
    check_model_server_args,
    check_server_args,
)
from hisparse_plan.adapters.sglang.server_args_table import (
    SERVER_ARG_ALIASES,
    check_server_arg,
)
from hisparse_plan.errors import PlanError, UnsupportedRequestError
from hisparse_plan.models import PlanRequest
from hisparse_plan.models.entry_input import refuse_preset
from hisparse_plan.models.json_input import MAX_DEPTH, excerpt, load_json_object
from hisparse_plan.models.sglang_settings import SGLangSettings
from hisparse_plan.presets import (
    Architecture,
    ModelArchitecture,
    RegularArchitecture,
    Settings,
    build_request,
)
from hisparse_plan.presets.config_file import model_from_config, read_config_file
from hisparse_plan.presets.families import family_of
from hisparse_plan.presets.kv_dtypes import KVDtype
from hisparse_plan.targets.sglang.modes.parallel import attn_tp_size
from hisparse_plan.targets.sglang.served.hf_config import SGLangConfigFacts, read_sglang_config

SERVER_ARGS: Final[dict[str, str]] = {
    "page_size": "page_size",
    "kv_cache_dtype": "kv_cache_dtype",
    "dsa_backend": "dsa_backend",
    "context_length": "context_length",
    "max_running_requests": "max_running_requests",
    "max_total_tokens": "max_total_tokens",
    "mem_fraction_static": "mem_fraction_static",
    "swa_full_tokens_ratio": "swa_full_tokens_ratio",
    "mamba_full_memory_ratio": "mamba_full_memory_ratio",
    "max_mamba_cache_size": "max_mamba_cache_size",
    "mamba_ssm_dtype": "mamba_ssm_dtype",
    "speculative_algorithm": "speculative_algorithm",
    "speculative_num_steps": "speculative_num_steps",
    "speculative_eagle_topk": "speculative_eagle_topk",
    "speculative_num_draft_tokens": "speculative_num_draft_tokens",
    "tp_size": "tp_size",
    "enable_dp_attention": "enable_dp_attention",
    "dp_size": "dp_size",
    "moe_a2a_backend": "moe_a2a_backend",
    "disable_radix_cache": "disable_radix_cache",
    "dcp_size": "dcp_size",
    "pp_size": "pp_size",
    "chunked_prefill_size": "chunked_prefill_size",
    "disable_decode_cuda_graph": "disable_decode_cuda_graph",
    "disable_prefill_cuda_graph": "disable_prefill_cuda_graph",
    "enable_hisparse": "enable_hisparse",
    "allow_overwrite_longer_context_len": "allow_overwrite_longer_context_len",
    "enable_multimodal": "enable_multimodal",
    "deepep_mode": "deepep_mode",
    "disable_overlap_schedule": "disable_overlap_schedule",
}
"""SGLang server arguments that are SGLangSettings fields under the same name."""
LAYER_ARGS: Final = frozenset({"hisparse_config", "speculative_draft_model_path"})
"""Server arguments read here rather than copied: HiSparse's JSON, the draft model's checkpoint
(adapters/sglang/draft.py). (`tp_size` is copied, and also splits the layers' heads.)"""
HISPARSE_CONFIG: Final[dict[str, str]] = {
    "top_k": "hisparse_top_k",
    "device_buffer_size": "hisparse_device_buffer_size",
    "host_to_device_ratio": "hisparse_host_to_device_ratio",
}
"""`--hisparse-config` keys that size the pools, and the settings they become."""
MODELLED: Final = frozenset({*SERVER_ARGS, *LAYER_ARGS, *SERVER_ARG_ALIASES, "hisparse_config"})
"""Server arguments the plan reads (server_args_table.py: the rest are refused or ignored)."""
HISPARSE_CONFIG_IGNORED: Final = frozenset({
    "swap_in_block_size", "algorithm", "backend", "min_sparse_prompt_len", "page_size",
})
"""`--hisparse-config` keys that do not move a pool (kernels, policies). Any other key SGLang
keeps as the sparse algorithm's extra settings (mem_cache/sparsity/factory.py,
`sparse_extra_config`), and so does the plan: it moves no pool."""
SWAP_IN_BLOCK: Final = (1, 1024)
"""The swap_in_block_size SGLang takes (mem_cache/sparsity/factory.py, _parse_sparse_config)."""
BF16_DSA_DTYPES: Final = frozenset({"auto", "bfloat16", "float16"})
"""SGLang kv dtypes that keep a DSA model's latent rows unquantized on Hopper (`auto` is
bfloat16 there)."""


def mapping_argument(value: object, name: str) -> Mapping[str, Any]:
    """`value` when it is a mapping (a dict), else a PlanError naming the argument: a caller
    handing JSON text or a list where a dict goes gets a refusal, not an AttributeError."""
    if not isinstance(value, Mapping):
        raise PlanError(f"{name}: expected a mapping (a dict), got {type(value).__name__}",
                        field=name)
    return value


def hisparse_config_object(config: object) -> Mapping[str, Any]:
    """`--hisparse-config` as a mapping: its JSON text read strictly (a key named twice, or
    nesting past MAX_DEPTH, refused), or the mapping given."""
    if isinstance(config, str):
        try:
            return load_json_object(config, what="hisparse_config", max_depth=MAX_DEPTH)
        except PlanError as error:
            if error.field == "hisparse_config":
                raise
            # A key named twice: its path is inside hisparse_config.
            raise PlanError(f"hisparse_config.{error}", field=f"hisparse_config.{error.field}"
                            ) from None
    if not isinstance(config, Mapping):
        raise PlanError(f"hisparse_config: expected a JSON object, got "
                        f"{type(config).__name__}", field="hisparse_config")
    return config


def hisparse_settings(config: Mapping[str, Any] | str) -> dict[str, Any]:
    """`--hisparse-config` (its JSON text or dict) as SGLangSettings fields."""
    config = hisparse_config_object(config)
    fields = {}
    for key, value in config.items():
        if key in HISPARSE_CONFIG:
            fields[HISPARSE_CONFIG[key]] = value
    block = config.get("swap_in_block_size", 960)
    low, high = SWAP_IN_BLOCK
    if not isinstance(block, int) or isinstance(block, bool) or not low <= block <= high:
        raise PlanError(f"hisparse_config.swap_in_block_size: SGLang takes an integer in "
                        f"[{low}, {high}]; got {block!r}",
                        field="hisparse_config.swap_in_block_size")
    return fields


def alias_settings(server_args: Mapping[str, Any]) -> dict[str, Any]:
    """The settings ServerArgs fields of other names give: the DSA backend from
    dsa_prefill_backend and dsa_decode_backend (each `dsa_backend` when not given; trtllm on
    either keeps raw rows, otherwise the two must agree), `disable_cuda_graph` as both graph
    switches."""
    fields: dict[str, Any] = {}
    if server_args.get("disable_cuda_graph"):
        fields["disable_decode_cuda_graph"] = fields["disable_prefill_cuda_graph"] = True
    backend = server_args.get("dsa_backend")
    prefill = server_args.get("dsa_prefill_backend") or backend
    decode = server_args.get("dsa_decode_backend") or backend
    if prefill == decode:
        if prefill is not None:
            fields["dsa_backend"] = prefill
    elif "trtllm" in (prefill, decode):
        fields["dsa_backend"] = "trtllm"
    else:
        raise UnsupportedRequestError(
            f"server_args.dsa_decode_backend: a DSA prefill backend other than the decode "
            f"one is not planned unless one is trtllm; expected {prefill!r}, got {decode!r}",
            field="server_args.dsa_decode_backend")
    return fields


def settings_from_server_args(
    server_args: Mapping[str, Any], memory: Mapping[str, Any] | None = None,
    *, context_length: int | None = None, gpu: Mapping[str, Any] | None = None,
) -> SGLangSettings:
    """SGLangSettings from SGLang's server arguments (`page_size`, `kv_cache_dtype`,
    `hisparse_config`, ...) and a case's memory figures (`pre_model_load_free_bytes` with
    `post_weights_free_bytes`; an `available_bytes` budget is the request's device memory).
    `context_length` is the default when the arguments give none (the model's length)."""
    server_args = mapping_argument(server_args, "server_args")
    memory = None if memory is None else mapping_argument(memory, "memory")
    gpu = None if gpu is None else mapping_argument(gpu, "gpu")
    fields: dict[str, Any] = {"name": "sglang"}
    for key, value in server_args.items():
        if value is None or not check_server_arg(key, value, MODELLED):
            continue  # SGLang's default, or a field SGLang's pools do not read
        if key in SERVER_ARGS:
            fields[SERVER_ARGS[key]] = value
        elif key == "hisparse_config":
            fields.update(hisparse_settings(value))
    fields.update(alias_settings(server_args))
    capability = None if gpu is None else gpu.get("capability")
    # SGLang's own startup checks of the fields left alone.
    check_server_args(server_args, tuple(capability) if isinstance(capability, list | tuple)
                      and len(capability) == 2 else None)
    fields.setdefault("context_length", context_length)
    if gpu is not None and gpu.get("total_memory_bytes") is not None:
        fields["gpu_memory_bytes"] = gpu["total_memory_bytes"]
    if gpu is not None and gpu.get("capability") is not None:
        fields["compute_capability"] = gpu["capability"]
    for key in ("pre_model_load_free_bytes", "post_weights_free_bytes"):
        if memory is not None and key in memory:
            fields[key] = memory[key]
    try:
        return SGLangSettings.model_validate(fields)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "server_args"
        raise PlanError(f"server_args.{where}: {first['msg']}, got "
                        f"{excerpt(first.get('input'), 80)}", field=f"engine.{where}") from None


def layer_kv_dtype(arch: Architecture, kv_cache_dtype: str) -> KVDtype | None:
    """The cache dtype the layers are built in: a DSA model's latent rows are bfloat16 under
    SGLang's `auto` on Hopper, fp8 (656-byte packed rows or 576 raw, as the backend decides)
    otherwise; a regular model's layers keep the model dtype (SGLang's planner applies an
    explicit `kv_cache_dtype` itself)."""
    if not isinstance(arch, ModelArchitecture):
        return None
    return "bfloat16" if kv_cache_dtype in BF16_DSA_DTYPES else "fp8_ds_mla"


def sglang_request(
    arch: Architecture, engine: SGLangSettings, *, tp: int = 1,
    available_bytes: int | None = None,
) -> PlanRequest:
    """The request SGLang plans for `arch` on one of `tp` ranks: the layers the project reads
    for the model (vLLM's names, one rank's heads), no vLLM HiSparse section (SGLang's HiSparse
    is `engine.enable_hisparse`), max_model_len the context length."""
    if not isinstance(arch, ModelArchitecture | RegularArchitecture):
        raise PlanError(f"arch: expected a model's architecture (a preset's, or a config's read "
                        f"by model_from_config), got {type(arch).__name__}", field="arch")
    if not isinstance(engine, SGLangSettings):
        raise PlanError(f"engine: expected SGLangSettings, got {type(engine).__name__}",
                        field="engine")
    settings = Settings(
        tp=tp, kv_dtype=layer_kv_dtype(arch, engine.kv_cache_dtype),
        max_model_len=engine.context_length, allow_long_context=True,
        gpu_mem_bytes=available_bytes,
        hisparse=False if isinstance(arch, ModelArchitecture) else None,
    )
    refuse_unserved(arch)
    request = build_request(arch, settings)
    data = request.model_dump(mode="json")
    data["engine"] = engine.model_dump(mode="json")
    # Which window layers get a pool of their own is the target's rule, by
    # engine.architecture (targets/sglang/served/architectures.py, windows_in_full_pool).
    if isinstance(arch, ModelArchitecture):
        # SGLang's HiSparse coordinator runs the model's index_topk.
        data["model"]["index_topk"] = arch.index_topk
    return PlanRequest.model_validate(data)


def refuse_unserved(arch: Architecture) -> None:
    """A family SGLang does not serve, or serves with caches the SGLang target does not plan,
    is refused naming why (its family's `SGLangRule.refusal`)."""
    if not isinstance(arch, RegularArchitecture):
        return
    refusal = family_of(arch.model_type).sglang.refusal
    if refusal is not None:
        raise UnsupportedRequestError(
            f"model_type: {arch.model_type!r} is not planned for SGLang: {refusal}",
            field="model_type",
        )


def model_of_case(config: Mapping[str, Any] | str | Path) -> Architecture:
    """A case's model: its config.json dict, or a path to one (relative to the working
    directory), read as the project reads any config.json (`untrusted_json`: a regular file
    of bounded size, UTF-8, no key twice)."""
    return sglang_model_of_case(config)[0]


def sglang_model_of_case(
    config: Mapping[str, Any] | str | Path,
) -> tuple[Architecture, SGLangConfigFacts]:
    """model_of_case with what SGLang reads of the config beside its layers (its refusals
    first: no model_type, an architecture SGLang does not serve); the layers are read from the
    config as SGLang serves it."""
    refuse_preset(config, "config", "a config.json dict, a path to one, or an architecture")
    if isinstance(config, Mapping):
        data, origin = config, "config"
    elif isinstance(config, str | Path):
        data, origin = read_config_file(config), str(config)
    else:
        raise PlanError(f"config: expected a config.json dict or a path to one, got "
                        f"{type(config).__name__}", field="config")
    facts = read_sglang_config(data)
    return model_from_config(facts.config, origin=origin), facts


def config_settings(facts: SGLangConfigFacts) -> dict[str, Any]:
    """The SGLang settings a config's facts fill in."""
    return {"architecture": facts.architecture, "model_context_length": facts.context_length,
            "model_is_multimodal": facts.multimodal, "vision_encoder": facts.vision_encoder}


def request_from_server_args(
    config: Mapping[str, Any] | str | Path | Architecture,
    server_args: Mapping[str, Any],
    memory: Mapping[str, Any],
    *,
    gpu: Mapping[str, Any] | None = None,
    draft_config: Mapping[str, Any] | str | Path | None = None,
) -> PlanRequest:
    """The request for a model (a config.json dict or path, or an architecture) served with
    SGLang's `server_args` (`tp_size` splits the heads, over `dp_size` groups with
    `enable_dp_attention`) on `memory`: either
    `{"pre_model_load_free_bytes", "post_weights_free_bytes"}` or `{"available_bytes"}`.
    With speculative decoding, the draft's layers from `draft_config` (an EAGLE draft's
    config.json), else as SGLang finds its draft (adapters/sglang/draft.py)."""
    server_args = mapping_argument(server_args, "server_args")
    memory = mapping_argument(memory, "memory")
    facts: SGLangConfigFacts | None = None
    if isinstance(config, ModelArchitecture | RegularArchitecture):
        arch: Architecture = config
    else:
        arch, facts = sglang_model_of_case(config)
    default_length = arch.max_position_embeddings
    if facts is not None and facts.context_length is not None:
        default_length = facts.context_length
    engine = settings_from_server_args(
        server_args, memory, context_length=default_length, gpu=gpu
    )
    if facts is not None:
        check_model_server_args(server_args, facts.architecture)
        engine = engine.model_copy(update=config_settings(facts))
        drafted = draft_settings(facts.config, server_args, draft_config, attn_tp_size(engine))
        engine = SGLangSettings.model_validate({**engine.model_dump(), **drafted})
    tp = server_args.get("tp_size")
    tp = 1 if tp is None else tp
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        raise PlanError(f"server_args.tp_size: expected a positive integer, got {tp!r}",
                        field="server_args.tp_size")
    available = memory.get("available_bytes")
    if available is not None and (not isinstance(available, int) or isinstance(available, bool)
                                  or available < 0):
        raise PlanError(f"memory.available_bytes: expected a byte count (an integer of at "
                        f"least 0), got {available!r}", field="memory.available_bytes")
    if available is None and engine.pre_model_load_free_bytes is None:
        raise PlanError("memory: expected available_bytes, or pre_model_load_free_bytes with "
                        "post_weights_free_bytes", field="memory")
    # With DP attention the heads split over one attention group's ranks, tp / dp.
    request = sglang_request(arch, engine, tp=attn_tp_size(engine), available_bytes=available)
    if facts is not None and facts.index_topk is not None and request.model.index_topk is None:
        # A model the project reads without an indexer (DeepSeek-V4) still hands SGLang's
        # HiSparse coordinator its config's index_topk.
        model = request.model.model_copy(update={"index_topk": facts.index_topk})
        request = request.model_copy(update={"model": model})
    return request


def with_engine(request: PlanRequest, engine: SGLangSettings) -> PlanRequest:
    """`request` (its layers kept) planned for SGLang with `engine`."""
    return request.model_copy(update={"engine": engine})


__all__ = [
    "hisparse_config_object",
    "hisparse_settings",
    "layer_kv_dtype",
    "mapping_argument",
    "model_of_case",
    "request_from_server_args",
    "settings_from_server_args",
    "sglang_model_of_case",
    "sglang_request",
    "with_engine",
]
