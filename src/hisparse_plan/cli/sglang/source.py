"""SGLang as the engine of `plan` and `capacity`: its flags (SGLang's own spellings), the
request they give for a preset or a config.json, and the memory it sizes its pools from."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import Any, Final

from hisparse_plan.adapters.sglang import sglang_request
from hisparse_plan.adapters.sglang.request import (
    config_settings,
    hisparse_settings,
    sglang_model_of_case,
)
from hisparse_plan.cli.arg_types import AUTO, non_negative_int, positive_int, positive_tokens
from hisparse_plan.cli.deployment_args import deployment_weights
from hisparse_plan.cli.errors import CommandError
from hisparse_plan.cli.input_files import config_label
from hisparse_plan.cli.sglang.draft_path import (
    TARGET_CONFIG,
    add_draft_path_argument,
    draft_path_settings,
    preset_config,
    with_target_windows,
)
from hisparse_plan.models import PlanRequest
from hisparse_plan.models.sglang_settings import DSABackend, SGLangSettings
from hisparse_plan.presets import (
    DEFAULTS,
    Architecture,
    ModelArchitecture,
    load_preset,
)
from hisparse_plan.presets.config_file import read_config_file
from hisparse_plan.presets.hardware import find_gpu, weight_bytes
from hisparse_plan.targets.sglang.modes.parallel import attn_dp_size, attn_tp_size

SGLANG_KV_CACHE_DTYPES: Final[dict[str, str]] = {
    "auto": "auto", "bfloat16": "bfloat16", "fp8": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3",
    "fp8_e5m2": "fp8_e5m2", "fp8_ds_mla": "fp8_e4m3",
}
"""`--kv-cache-dtype` (vLLM's names) as SGLang's: fp8 is fp8_e4m3 (656-byte packed DSA rows
with the flashmla_kv backend)."""
PRESET_ARCHITECTURES: Final[dict[str, str]] = {
    "deepseek_v32": "DeepseekV32ForCausalLM", "glm_moe_dsa": "GlmMoeDsaForCausalLM",
    "llama": "LlamaForCausalLM", "gemma3_text": "Gemma3ForCausalLM",
    "gpt_oss": "GptOssForCausalLM", "qwen3_next": "Qwen3NextForCausalLM",
    "deepseek_v4": "DeepseekV4ForCausalLM",
}
"""The architecture a preset's model_type names in its published config.json (SGLang picks
its model class, window pools and Blackwell backends by it); a preset's config keeps only the
cache-shaping fields."""
NEXTN_LAYERS: Final = "_num_nextn_predict_layers"
"""A config's MTP layers, carried beside its facts to the speculative flags."""
DSA_BACKENDS: Final[tuple[DSABackend, ...]] = (
    "flashmla_kv", "trtllm", "tilelang", "flashmla_sparse", "fa3",
)


def fraction(text: str) -> float:
    """A fraction strictly between 0 and 1."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number between 0 and 1, got {text!r}"
                                         ) from None
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"expected a number between 0 and 1, got {text}")
    return value


def add_sglang_arguments(parser: argparse.ArgumentParser) -> None:
    """SGLang's server flags that move its pools, under SGLang's names (`--engine sglang`)."""
    group = parser.add_argument_group(
        "how SGLang runs it (--engine sglang; defaults: SGLang 0.5.23's)",
        "Each flag keeps SGLang's name and meaning; see docs/planning-rules.md#sglang.",
    )
    group.add_argument("--page-size", type=positive_int, metavar="TOKENS",
                       help="tokens per page (default: 64 for DSA models, else 1)")
    group.add_argument("--mem-fraction-static", type=fraction, metavar="F",
                       help="share of the GPU's memory for weights and KV pools; needs --gpu "
                            "(default: SGLang's rule for the GPU, about 0.89 on an H200)")
    group.add_argument("--max-running-requests", type=positive_int, metavar="N",
                       help="request slots (default: SGLang's estimate from the tokens)")
    group.add_argument("--context-length", type=positive_tokens, metavar="TOKENS",
                       help="longest request (the same as --max-model-len; default: the "
                            "model's)")
    group.add_argument("--max-total-tokens", type=positive_int, metavar="N",
                       help="cap on the KV pool's tokens")
    group.add_argument("--enable-hisparse", action="store_true",
                       help="HiSparse on a DSA model: every token in a pinned host pool, a hot "
                            "buffer per request on the GPU")
    group.add_argument("--hisparse-config", metavar="JSON",
                       help='HiSparse settings, as SGLang\'s: {"top_k": 2048, '
                            '"device_buffer_size": 4096, "host_to_device_ratio": 2}')
    group.add_argument("--dsa-backend", choices=DSA_BACKENDS, metavar="NAME",
                       help=f"DSA attention backend ({', '.join(DSA_BACKENDS)}; default "
                            "flashmla_kv): trtllm and tilelang keep 576-byte latent rows, "
                            "flashmla_kv packs fp8 ones in 656")
    group.add_argument("--swa-full-tokens-ratio", type=fraction, metavar="F",
                       help="window-pool tokens per full-pool token (default 0.8)")
    group.add_argument("--max-mamba-cache-size", type=positive_int, metavar="N",
                       help="Mamba state slots (default: from the memory)")
    group.add_argument("--enable-dp-attention", action="store_true",
                       help="attention data parallelism: --dp-size groups of tp / dp ranks, "
                            "each with its own pools and share of --max-running-requests")
    group.add_argument("--dp-size", type=positive_int, metavar="N",
                       help="attention DP groups with --enable-dp-attention (a divisor of "
                            "--tp), else replicas that each plan as one (default 1)")
    group.add_argument("--disable-radix-cache", action="store_true",
                       help="no prefix cache (prefill/decode nodes): one Mamba state slot a "
                            "request; with --max-running-requests, a window pool sized for "
                            "those requests")
    group.add_argument("--disable-overlap-schedule", action="store_true",
                       help="the overlap scheduler off: its Mamba radix strategy and window "
                            "chunks in flight follow it")
    group.add_argument("--dcp-size", type=positive_int, metavar="N",
                       help="decode context parallelism of a DSA model over N ranks: latent "
                            "rows sharded, index keys whole (default 1)")
    group.add_argument("--speculative-algorithm", type=str.upper,
                       choices=("NEXTN", "EAGLE", "EAGLE3"), metavar="NAME",
                       help="speculative decoding (NEXTN: the model's own MTP layers as the "
                            "draft, DeepSeek's documented setup; EAGLE, EAGLE3: a draft model "
                            "of --speculative-draft-num-layers layers): the draft's layers join "
                            "the bytes a token, its pool shares the target's tokens, "
                            "--max-running-requests defaults to 48")
    group.add_argument("--speculative-num-steps", type=positive_int, metavar="N",
                       help="draft steps (default: SGLang's choice, 3; 5 for Llama)")
    group.add_argument("--speculative-eagle-topk", type=positive_int, metavar="K",
                       help="draft branches a step (default: SGLang's choice, 1; 4 for Llama)")
    group.add_argument("--speculative-num-draft-tokens", type=positive_int, metavar="N",
                       help="draft tokens verified a step (default: steps + 1 with top-k 1)")
    group.add_argument("--speculative-draft-num-layers", type=positive_int, metavar="N",
                       help="the draft model's KV layers (default with NEXTN: the model's "
                            "num_nextn_predict_layers)")
    add_draft_path_argument(group)
    group.add_argument("--pp-size", type=positive_int, metavar="N",
                       help="pipeline stages: each rank keeps the decoder layers SGLang gives "
                            "it and all take the fewest tokens any rank holds (default 1)")
    group.add_argument("--pp-rank", type=non_negative_int, metavar="R",
                       help="the pipeline rank to plan, 0 to --pp-size - 1 (default 0)")
    group.add_argument("--moe-a2a-backend", choices=("none", "deepep"),
                       help="MoE all-to-all: deepep keeps 2 GiB (3 with prefill graphs) more "
                            "out of SGLang's default fraction (default none)")


SGLANG_ONLY: Final[tuple[tuple[str, str], ...]] = (
    ("page_size", "--page-size"),
    ("mem_fraction_static", "--mem-fraction-static"),
    ("max_running_requests", "--max-running-requests"),
    ("context_length", "--context-length"),
    ("max_total_tokens", "--max-total-tokens"),
    ("enable_hisparse", "--enable-hisparse"),
    ("hisparse_config", "--hisparse-config"),
    ("dsa_backend", "--dsa-backend"),
    ("swa_full_tokens_ratio", "--swa-full-tokens-ratio"),
    ("max_mamba_cache_size", "--max-mamba-cache-size"),
    ("enable_dp_attention", "--enable-dp-attention"),
    ("dp_size", "--dp-size"),
    ("moe_a2a_backend", "--moe-a2a-backend"),
    ("disable_radix_cache", "--disable-radix-cache"),
    ("disable_overlap_schedule", "--disable-overlap-schedule"),
    ("dcp_size", "--dcp-size"),
    ("speculative_algorithm", "--speculative-algorithm"),
    ("speculative_num_steps", "--speculative-num-steps"),
    ("speculative_eagle_topk", "--speculative-eagle-topk"),
    ("speculative_num_draft_tokens", "--speculative-num-draft-tokens"),
    ("speculative_draft_num_layers", "--speculative-draft-num-layers"),
    ("speculative_draft_model_path", "--speculative-draft-model-path"),
    ("pp_size", "--pp-size"),
    ("pp_rank", "--pp-rank"),
)
"""(dest, flag) of every SGLang-only flag."""


@dataclass(frozen=True, slots=True)
class SGLangSource:
    request: PlanRequest
    title: str
    memory: str
    """Where the budget came from, in words."""


def _model(
    args: argparse.Namespace,
) -> tuple[Architecture, str, int | None, dict[str, Any]]:
    """The model, its title, its default context length and what SGLang reads of its config
    beside the layers (architecture, derived context length)."""
    if args.model is not None:
        preset = load_preset(args.model)
        default = preset.default_max_model_len
        arch = preset.architecture
        facts: dict[str, Any] = {
            "architecture": PRESET_ARCHITECTURES.get(arch.model_type or ""),
            "model_context_length": arch.max_position_embeddings,
        }
        facts[TARGET_CONFIG] = preset_config(arch, facts["architecture"])
        return arch, preset.title, None if default == AUTO else default, facts
    config = read_config_file(args.hf_config, label=config_label(args.hf_config))
    arch, read = sglang_model_of_case(config)
    title = f"{args.hf_config}" + (f" ({arch.model_type})" if arch.model_type else "")
    facts = config_settings(read)
    nextn = read.config.get("num_nextn_predict_layers")
    if isinstance(nextn, int) and not isinstance(nextn, bool) and nextn > 0:
        facts[NEXTN_LAYERS] = nextn
    facts[TARGET_CONFIG] = read.config
    return arch, title, read.context_length, facts


def _context_length(args: argparse.Namespace, arch: Architecture, default: int | None) -> int:
    given = args.context_length
    length = args.max_model_len
    if given is not None and length is not None:
        raise CommandError("--context-length and --max-model-len both set the longest request; "
                           "expected one of them")
    if length == AUTO:
        raise CommandError("--max-model-len auto: SGLang does not fit the context to the memory; "
                           "expected a token count (or --context-length)")
    chosen = given if given is not None else length
    trained = arch.max_position_embeddings
    if chosen is None:
        return default or trained
    if chosen > trained and not args.allow_long_context:
        raise CommandError(f"--context-length: expected at most the model's "
                           f"max_position_embeddings ({trained}), got {chosen}; pass "
                           "--allow-long-context to plan it anyway")
    return int(chosen)


def _uses_mla(arch: Architecture) -> bool:
    return isinstance(arch, ModelArchitecture) or bool(getattr(arch, "kv_lora_rank", None))


def _memory(
    args: argparse.Namespace, arch: Architecture, tp: int
) -> tuple[dict[str, Any], int | None, str]:
    """The engine's memory fields, the budget given outright (else None) and a description."""
    given = args.gpu_mem if args.gpu_mem is not None else args.kv_cache_memory
    if args.gpu is None:
        if args.mem_fraction_static is not None:
            raise CommandError("--mem-fraction-static needs --gpu NAME (the memory it is a "
                               "share of)")
        for flag, value in (("--weights-bytes", args.weights_bytes),
                            ("--parameters", args.parameters)):
            if value is not None:
                raise CommandError(f"{flag} needs --gpu NAME")
        budget = given if given is not None else DEFAULTS.gpu_mem_bytes
        if budget is None:
            raise CommandError("--engine sglang: expected --gpu NAME or --gpu-mem SIZE")
        return {}, budget, "KV budget given" if given is not None else "default KV budget"
    if given is not None:
        raise CommandError("--gpu and --gpu-mem both set the KV memory; expected one of them")
    gpu = find_gpu(args.gpu)
    weights = deployment_weights(args)
    total = weights if isinstance(weights, int) else weight_bytes(weights)
    per_rank = math.ceil(total / tp)
    if per_rank >= gpu.hbm_bytes:
        raise CommandError(f"--gpu: {gpu.title} holds {gpu.hbm_bytes} B, but one of {tp} ranks "
                           f"takes {per_rank} B of weights; expected less (add --tp ranks)")
    fields: dict[str, Any] = {
        "pre_model_load_free_bytes": gpu.hbm_bytes,
        "post_weights_free_bytes": gpu.hbm_bytes - per_rank,
        # The GPU's total and the ranks feed SGLang's default rule when no fraction is given.
        "gpu_memory_bytes": gpu.hbm_bytes,
        # SGLang's Blackwell defaults (fp8 DSA rows, trtllm pages) follow the capability.
        "compute_capability": gpu.compute_capability,
    }
    if args.mem_fraction_static is not None:
        fields["mem_fraction_static"] = args.mem_fraction_static
    fraction = ("SGLang's default rule" if args.mem_fraction_static is None
                else f"{args.mem_fraction_static:g}")
    words = f"{gpu.name}, weights {per_rank} B a rank, mem_fraction_static {fraction}"
    return fields, None, words


def sglang_ranks(args: argparse.Namespace) -> tuple[int, int | None]:
    """SGLang's tp_size and dp_size for the flags: --tp and --dp-size as given; with
    --enable-dp-attention and vLLM's -dp N but no --dp-size, SGLang's documented DP-attention
    launch on the GPUs vLLM's --tp x -dp N run on (`--tp-size tp*N --dp-size N`), so that
    `capacity --engine vllm,sglang` sets the two engines' documented setups side by side."""
    tp = args.tp or 1
    if args.enable_dp_attention and args.dp_size is None and (args.dp or 1) > 1:
        return tp * args.dp, args.dp
    return tp, args.dp_size


def sglang_settings(args: argparse.Namespace, arch: Architecture, tp: int,
                    default_length: int | None, facts: dict[str, Any] | None = None,
                    dp_size: int | None = None,
                    ) -> tuple[SGLangSettings, int | None, str]:
    """SGLangSettings from the flags (`dp_size`: SGLang's, where sglang_ranks decided it), the
    budget given outright, and the memory's words."""
    # A pipeline rank holds its share of the layers' weights too.
    memory, budget, words = _memory(args, arch, tp * (args.pp_size or 1))
    fields: dict[str, Any] = {
        "name": "sglang",
        "context_length": _context_length(args, arch, default_length),
        "kv_cache_dtype": SGLANG_KV_CACHE_DTYPES[args.kv_dtype or "auto"],
        "tp_size": tp,
        "enable_dp_attention": bool(args.enable_dp_attention),
        "disable_radix_cache": bool(args.disable_radix_cache),
        "disable_overlap_schedule": bool(args.disable_overlap_schedule),
        # --allow-long-context is SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 to SGLang.
        "allow_overwrite_longer_context_len": bool(args.allow_long_context),
        **(facts or {}),
        **memory,
    }
    target = fields.pop(TARGET_CONFIG, None)
    fields.update(_speculative(args, arch, fields.pop(NEXTN_LAYERS, None)))
    for dest in ("page_size", "max_running_requests", "max_total_tokens", "dsa_backend",
                 "swa_full_tokens_ratio", "max_mamba_cache_size", "dp_size", "moe_a2a_backend",
                 "dcp_size", "pp_size", "pp_rank"):
        value = getattr(args, dest)
        if value is not None:
            fields[dest] = value
    if dp_size is not None:
        fields["dp_size"] = dp_size
    fields.update(draft_path_settings(args, target, fields))
    if args.hisparse_config is not None:
        if not args.enable_hisparse:
            raise CommandError("--hisparse-config needs --enable-hisparse")
        fields.update(hisparse_settings(args.hisparse_config))
    fields["enable_hisparse"] = bool(args.enable_hisparse)
    if dp_size is not None:
        fields["dp_size"] = dp_size
    if (args.pp_rank or 0) >= (args.pp_size or 1):
        raise CommandError(f"--pp-rank: expected a rank below --pp-size {args.pp_size or 1}, "
                           f"got {args.pp_rank}")
    if args.enable_dp_attention and tp % fields.get("dp_size", 1):
        raise CommandError(f"--dp-size: DP attention splits --tp into --dp-size groups; "
                           f"expected a divisor of {tp}, got {fields.get('dp_size')}")
    return SGLangSettings.model_validate(fields), budget, words


def _speculative(
    args: argparse.Namespace, arch: Architecture, config_nextn: int | None
) -> dict[str, Any]:
    """The speculative flags as settings; with NEXTN the draft's layers default to the
    model's num_nextn_predict_layers (a preset's or its config.json's)."""
    algorithm = args.speculative_algorithm
    fields: dict[str, Any] = {
        dest: getattr(args, dest) for dest in (
            "speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens",
            "speculative_draft_num_layers") if getattr(args, dest) is not None}
    if algorithm is None:
        if fields:
            raise CommandError(f"--{next(iter(fields)).replace('_', '-')} needs "
                               "--speculative-algorithm")
        return {}
    fields["speculative_algorithm"] = algorithm
    if getattr(args, "speculative_draft_model_path", None) is not None:
        return fields  # the draft's layers come from the draft (draft_path.py)
    if "speculative_draft_num_layers" not in fields:
        layers = config_nextn or getattr(arch, "num_nextn_predict_layers", 0)
        if algorithm != "NEXTN" or not layers:
            raise CommandError(f"--speculative-algorithm {algorithm}: expected "
                               "--speculative-draft-num-layers N (the draft's layers; NEXTN "
                               "reads the model's num_nextn_predict_layers, which it has none "
                               "of)" if algorithm == "NEXTN" else
                               f"--speculative-algorithm {algorithm}: expected "
                               "--speculative-draft-num-layers N (the draft model's layers)")
        fields["speculative_draft_num_layers"] = layers
    return fields


def resolve_sglang_source(args: argparse.Namespace) -> SGLangSource:
    """The SGLang request the arguments name (a preset or a config.json)."""
    if (args.model is None) == (args.hf_config is None):
        raise CommandError("--engine sglang: expected exactly one of MODEL or --hf-config FILE "
                           "(a request file is vLLM's)")
    arch, title, default_length, facts = _model(args)
    tp, dp_size = sglang_ranks(args)
    engine, budget, words = sglang_settings(args, arch, tp, default_length, facts, dp_size)
    request = with_target_windows(args, sglang_request(arch, engine, tp=attn_tp_size(engine),
                                                       available_bytes=budget))
    dp = f", DP attention {engine.dp_size}" if attn_dp_size(engine) > 1 else ""
    if engine.pp_size > 1:
        dp += f", pipeline rank {engine.pp_rank} of {engine.pp_size}"
    title = f"{title} on SGLang 0.5.23 (tp {tp}{dp}; {words})"
    return SGLangSource(request, title, words)
