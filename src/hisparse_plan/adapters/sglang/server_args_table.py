"""SGLang 0.5.23's `ServerArgs` as data: every field it has (server_args_0_5_23.json, written
from SGLang's own record by references/sglang_server_args_table.py), and what the plan does with
each. A field is one of

- modelled: read into `SGLangSettings` (request.SERVER_ARGS, SERVER_ARG_ALIASES) or into the
  layers (request.LAYER_ARGS, `hisparse_config`);
- unplanned: it moves SGLang's pools, budget or layout in a way the plan does not model
  (UNPLANNED, with why); refused when set to anything but SGLang's default;
- ignored: every other field (ports, logging, tokenizer, kernels that keep the pools' bytes):
  accepted and left alone, as SGLang's pool sizing leaves it.

A name that is no field of ServerArgs (and no case key, CASE_KEYS) is refused, naming it."""

from __future__ import annotations

import json
from collections.abc import Mapping
from importlib import resources
from typing import Any, Final

from hisparse_plan.errors import PlanError, UnsupportedRequestError

SGLANG_VERSION: Final = "0.5.23"
TABLE_FILE: Final = "server_args_0_5_23.json"


def _load_table() -> dict[str, dict[str, Any]]:
    text = resources.files(__package__).joinpath(TABLE_FILE).read_text(encoding="utf-8")
    loaded = json.loads(text)
    if loaded.get("sglang") != SGLANG_VERSION:  # a packaging fault, not bad input
        raise RuntimeError(f"{TABLE_FILE}: written for SGLang {loaded.get('sglang')!r}, "
                           f"expected {SGLANG_VERSION}")
    fields: dict[str, dict[str, Any]] = loaded["fields"]
    return fields


SERVER_ARGS_FIELDS: Final[Mapping[str, Mapping[str, Any]]] = _load_table()
"""Every field of SGLang 0.5.23's ServerArgs: its namespace (sglang/srt/arg_groups/fields/)
and, where it declares a plain one, its default."""

CASE_KEYS: Final = frozenset({"dsa_backend", "allow_overwrite_longer_context_len"})
"""Keys a case's server_args takes that ServerArgs does not: `dsa_backend` for both of
dsa_prefill_backend and dsa_decode_backend, and `allow_overwrite_longer_context_len` for
SGLang's SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN environment variable."""

SERVER_ARG_ALIASES: Final[dict[str, str]] = {
    "dsa_prefill_backend": "the DSA backend (with dsa_decode_backend)",
    "dsa_decode_backend": "the DSA backend (with dsa_prefill_backend)",
    "disable_cuda_graph": "both disable_decode_cuda_graph and disable_prefill_cuda_graph",
}
"""ServerArgs fields read into other settings (request.alias_settings)."""

_GRAPH = ("SGLang's default mem_fraction_static reserves memory for the CUDA graphs' batch "
          "sizes (arg_groups/memory_hook.py, reserve_for_graph_mb); the plan reserves it for "
          "SGLang's own graph settings only")
_BACKEND = ("the attention backend decides SGLang's page size and cache layout "
            "(ServerArgs resolution); the plan follows SGLang's own choice of backend")
_DISAGG = ("PD disaggregation changes SGLang's request pools and memory reserve "
           "(mem_cache/kv_cache_configurator.py, arg_groups/memory_hook.py)")
_HOST = "it adds a host KV pool or external KV cache the plan does not model"
_CP = "context parallelism shards the KV cache in a way the plan does not model"

UNPLANNED: Final[dict[str, str]] = {
    "attention_backend": _BACKEND,
    "decode_attention_backend": _BACKEND,
    "prefill_attention_backend": _BACKEND,
    "speculative_draft_attention_backend": _BACKEND,
    "dsv4_attn_backend": _BACKEND,
    "cuda_graph_config": _GRAPH,
    "cuda_graph_backend_decode": _GRAPH,
    "cuda_graph_backend_prefill": _GRAPH,
    "cuda_graph_max_bs_decode": _GRAPH,
    "cuda_graph_max_bs_prefill": _GRAPH,
    "cuda_graph_bs_decode": _GRAPH,
    "cuda_graph_bs_prefill": _GRAPH,
    "cuda_graph_prefill_max_context": _GRAPH,
    "cuda_graph_max_seq_len_prefill": _GRAPH,
    "enable_two_batch_overlap": "it turns SGLang's prefill CUDA graphs off (arg_groups/"
                                "cuda_graph_hook.py), which moves its default "
                                "mem_fraction_static",
    "enable_mis": "multi-item scoring turns SGLang's radix cache, chunked prefill and CUDA "
                  "graphs off, and needs the flashinfer attention backend (arg_groups/"
                  "attention_hook.py, _handle_multi_item_scoring)",
    "max_prefill_tokens": "SGLang's default mem_fraction_static reserves activations for "
                          "it when chunked prefill is off (arg_groups/memory_hook.py)",
    "disaggregation_mode": _DISAGG,
    "disaggregation_decode_extra_slots": _DISAGG,
    "disaggregation_decode_retraction_backup": _DISAGG,
    "num_reserved_decode_tokens": _DISAGG,
    "enable_pd_role_switch": _DISAGG,
    "enable_pdmux": _DISAGG,
    "language_only": _DISAGG,
    "language_model_only": _DISAGG,
    "encoder_only": _DISAGG,
    "enable_hierarchical_cache": _HOST,
    "enable_lmcache": _HOST,
    "enable_flexkv": _HOST,
    "enable_unified_cache_external_linker": _HOST,
    "disaggregation_decode_enable_offload_kvcache": _HOST,
    "radix_cache_backend": "a registered radix-cache backend (mem_cache/registry.py) may keep "
                           "pools of its own",
    "uses_mamba_radix_cache": "SGLang derives it from the model (configs/"
                              "linear_attn_model_registry.py)",
    "enable_unified_memory": "unified memory places SGLang's pools in another way "
                             "(mem_cache/kv_cache_configurator.py)",
    "enable_page_major_kv_layout": "it lays SGLang's KV pool out page-major, another layout "
                                   "than the plan's",
    "prefill_only_disable_kv_cache": "a prefill-only server keeps no KV cache",
    "disable_hybrid_swa_memory": "it keeps a window model's window layers in the full pool, "
                                 "which the plan does not model",
    "swa_prefix_tails": "it grows SGLang's window pool by prefix tails "
                        "(model_executor/pool_configurator.py)",
    "enable_encoder_swa_bounded_replay": "it sizes SGLang's window pool for replay "
                                         "(model_executor/pool_configurator.py)",
    "c128_page_size": "it pages DeepSeek-V4's c128 pool otherwise",
    "enable_deepseek_v4_fp4_indexer": "it stores DeepSeek-V4's index keys in fp4",
    "qsa_indexer_dtype": "it stores the indexer's keys in another dtype",
    "speculative_draft_kv_cache_dtype": "the draft's pool in another dtype",
    "speculative_draft_window_size": "the draft's window pool otherwise",
    "enable_multi_layer_eagle": "a multi-layer EAGLE draft's pools",
    "enable_linear_replayssm": "replayed linear-attention states add pools",
    "enable_linear_replayssm_spec": "replayed linear-attention states add pools",
    "linear_replayssm_cache_len": "replayed linear-attention states add pools",
    "enable_int8_mamba_checkpoint": "int8 Mamba checkpoints add pools",
    "int8_mamba_ckpt_size": "int8 Mamba checkpoints add pools",
    "mamba_radix_cache_strategy": "SGLang's Mamba state slots follow its strategy, which the "
                                  "plan takes from the radix and overlap settings",
    "mamba_track_interval": "SGLang's Mamba radix tracking sizes states by it",
    "mamba_max_states_per_path": "SGLang's Mamba radix tracking sizes states by it",
    "enable_mamba_cache_stochastic_rounding": "stochastic rounding keeps Mamba states otherwise",
    "mm_feature_transport": "CUDA IPC / VMM multimodal transport reserves device memory "
                            "(mem_cache/kv_cache_configurator.py)",
    "prefill_max_requests": "it caps SGLang's request slots (mem_cache/kv_cache_configurator.py)",
    "dtype": "the model's dtype is its config's (torch_dtype) in the plan",
    "quantization": "a quantization may store the KV cache otherwise "
                    "(mem_cache/kv_cache_configurator.py)",
    "json_model_override_args": "it rewrites the model's config: give the config as served",
    "model_impl": "another model implementation builds other caches",
    "is_embedding": "an embedding model's server keeps other pools",
    "device": "the plan is for CUDA devices",
    "dllm_algorithm": "a diffusion LM's scheduler keeps other pools",
    "enable_lora": "LoRA adapters take memory beside the KV pools",
    "lora_paths": "LoRA adapters take memory beside the KV pools",
    "attn_cp_size": _CP,
    "enable_prefill_cp": _CP,
    "enable_dsa_cache_layer_split": _CP,
    "enable_kv_cache_sharding": _CP,
    "enable_cp_decode_attn_tp": _CP,
    "enable_deterministic_inference": "deterministic inference picks other attention "
                                      "backends and chunk sizes",
    "dwdp_size": "DWDP runs attention DP over every rank and turns CUDA graphs off "
                 "(arg_groups/parallel_hook.py, handle_dwdp)",
    "rl_on_policy_target": "it turns deterministic inference on (arg_groups/attention_hook.py, "
                           "handle_deterministic_inference), which picks other attention "
                           "backends and chunk sizes",
    "attn_dp_size": "SGLang resolves it from dp_size with enable_dp_attention: give those",
    "_swa_full_tokens_ratio_explicitly_set": "SGLang's own bookkeeping of "
                                             "swa_full_tokens_ratio: give that instead",
    "_radix_eviction_policy_explicitly_set": "SGLang's own bookkeeping",
    "_speculative_draft_quantization_explicitly_set": "SGLang's own bookkeeping",
}
"""ServerArgs fields that move SGLang's memory in ways the plan does not model, and why: refused
unless at SGLang's default (or a value of PLANNED_VALUES)."""
PLANNED_VALUES: Final[dict[str, tuple[Any, ...]]] = {"device": ("cuda",)}
"""Values of unplanned fields besides their default that are what the plan models."""


def default_of(name: str) -> tuple[bool, Any]:
    """(whether ServerArgs declares a plain default for `name`, that default)."""
    entry = SERVER_ARGS_FIELDS[name]
    return ("default" in entry), entry.get("default")


def check_server_arg(key: str, value: object, modelled: frozenset[str]) -> bool:
    """Whether the plan reads `key` (it is among `modelled`); else whether it is a field
    SGLang has that the plan may leave alone (False), refusing a name SGLang does not have and
    an unplanned field set to anything but its default."""
    if key in modelled:
        return True
    if key not in SERVER_ARGS_FIELDS:
        raise PlanError(
            f"server_args.{key}: not a field of SGLang {SGLANG_VERSION}'s ServerArgs; expected "
            "one of its fields (sglang/srt/server_args.py) or a case key "
            f"({', '.join(sorted(CASE_KEYS))})", field=f"server_args.{key}")
    if key in UNPLANNED:
        has, default = default_of(key)
        if (not has or value != default) and value not in PLANNED_VALUES.get(key, ()):
            shown = f"SGLang's default {default!r}" if has else "unset"
            raise UnsupportedRequestError(
                f"server_args.{key}: {UNPLANNED[key]}; expected {shown}, got {value!r}",
                field=f"server_args.{key}")
    return False


__all__ = [
    "CASE_KEYS",
    "PLANNED_VALUES",
    "SERVER_ARGS_FIELDS",
    "SERVER_ARG_ALIASES",
    "SGLANG_VERSION",
    "UNPLANNED",
    "check_server_arg",
    "default_of",
]
