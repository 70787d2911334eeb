"""Where a request comes from (a preset, a config.json, a request file) and the flags that
shape it. Shared by every subcommand that plans."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace
from typing import Final

from hisparse_plan.cli.arg_types import (
    AUTO,
    max_model_len_arg,
    non_negative_int,
    positive_int,
    positive_size,
    size_arg,
)
from hisparse_plan.cli.deployment_args import add_deployment_arguments, deployment_settings
from hisparse_plan.cli.errors import CommandError
from hisparse_plan.cli.input_files import config_label, read_input
from hisparse_plan.cli.render import add_output_arguments
from hisparse_plan.cli.sizes import SIZE_HELP
from hisparse_plan.cli.vllm.engine_args import add_engine_arguments, engine_settings, titled
from hisparse_plan.cli.vllm.gpu_layout import RESOLVES_LAYOUT, resolve_for
from hisparse_plan.cli.vllm.layers import checked_by_vllm, refuse_without_config_file
from hisparse_plan.models import KVCacheLayout, PlanRequest
from hisparse_plan.presets import (
    DEFAULTS,
    Architecture,
    KVDtype,
    ModelArchitecture,
    RegularArchitecture,
    Settings,
    build_request,
    load_config_file,
    load_preset,
    override_request,
    preset_names,
)
from hisparse_plan.presets.catalog import Length
from hisparse_plan.presets.kv_dtypes import VLLM_KV_CACHE_DTYPES, resolve_kv_cache_dtype
from hisparse_plan.presets.settings import HOST_POOL_LAYOUTS, vllm_version
from hisparse_plan.targets.vllm.platform import Resolution

TP_HELP: Final = (
    "tensor-parallel ranks (default 1), as vLLM's: a regular model's KV heads and linear "
    "states are split over them. For HiSparse every rank keeps the same replicated MLA cache, "
    "so with N > 1 the ranks map ONE host pool (shared_host_pool, blocks aligned to 4096 bytes) "
    "and --host-pool is that node-wide pool (one per data-parallel rank with -dp), not a "
    "per-rank one. --gpu-mem stays per GPU; the plan and its concurrency hold for each rank and "
    "for the TP group alike"
)


@dataclass(frozen=True, slots=True)
class Source:
    """A request and what it was built from."""

    request: PlanRequest
    title: str
    architecture: ModelArchitecture | None
    """The sparse-MLA config fields, for a model HiSparse plans."""
    kv_dtype: KVDtype | None
    config: Architecture | None = None
    """The config fields of a preset or config.json, of any kind."""
    platform: Resolution | None = None
    """The backends and layout vLLM 0.34 resolves on the deployment's GPU (a preset's or
    config.json's request; a request file names its own layout)."""


def add_source_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("what to plan (exactly one)")
    group.add_argument(
        "model", nargs="?", metavar="MODEL",
        help=f"a model preset: {', '.join(preset_names())}",
    )
    group.add_argument("--request", metavar="FILE",
                       help="a plan request JSON file ('-' for stdin); the flags below override it")
    group.add_argument("--hf-config", metavar="FILE",
                       help="a model's config.json (Hugging Face), planned like a preset")
    parser.add_argument("--specs-from-vllm", action="store_true",
                        help="with --hf-config, where vLLM is installed: build the model with "
                             "vLLM's own model class on the meta device (no weights) and plan "
                             "only if its cache layers (kinds, heads, head sizes, windows, "
                             "states) are the config reading's, layer for layer")


def add_settings_arguments(parser: argparse.ArgumentParser, *, host_pool: bool = True) -> None:
    """The hardware and serving flags, under vLLM's names and meanings where vLLM has the flag
    (`vllm serve --help`); the older spellings stay as aliases."""
    group = parser.add_argument_group(
        "hardware and serving (defaults: the preset request; with --request: the file's)",
        f"{SIZE_HELP}. vLLM's flags keep vLLM's names and meanings.",
    )
    group.add_argument("--gpu-mem", type=size_arg, metavar="SIZE",
                       help="GPU memory for the KV cache, per GPU (preset default 60GiB; the "
                            "same as --kv-cache-memory-bytes)")
    if host_pool:
        group.add_argument("--host-pool", type=positive_size, metavar="SIZE",
                           help="pinned host (DRAM) pool for the source cache (HiSparse; preset "
                                "default 64GiB): one per data-parallel rank, shared by its "
                                "--tensor-parallel-size ranks")
        group.add_argument("--host-pool-layout", choices=HOST_POOL_LAYOUTS,
                           help="the host pool's placement (HiSparse): layer_outermost as vLLM "
                                "lays it out (default), or block_outermost, a block's source "
                                "pages back to back, lined up with a block-outermost prefill "
                                "for transfers (no engine runtime takes it yet: see "
                                "docs/transfer.md#placement-that-transfers-well)")
    group.add_argument("--max-model-len", type=max_model_len_arg, metavar="TOKENS",
                       help="longest request, e.g. 131072 or 128k (k = 1024 here; vLLM reads "
                            "128k as 128000); 'auto' (or -1) = the longest that fits the GPU "
                            "memory, up to the model's max_position_embeddings, as vLLM's "
                            "auto. Default: per model, its max_position_embeddings (auto for "
                            "llama-4-scout, whose 10M tokens fit no GPU)")
    group.add_argument("--spec-tokens", type=non_negative_int, metavar="N",
                       help="speculative tokens per decode step (default 0): decode queries are "
                            "1 + N rows")
    group.add_argument("--device-buffer", type=positive_int, metavar="ROWS",
                       help="hot rows per request (HiSparse; default (1 + N + 1) * index_topk)")
    group.add_argument("--layout", type=str.upper, choices=[lay.value for lay in KVCacheLayout],
                       help="device KV-cache layout, as VLLM_KV_CACHE_LAYOUT (default: the one "
                            "vLLM 0.34 resolves for the model on --gpu; refused where vLLM "
                            "refuses it)")
    group.add_argument("--kv-cache-dtype", "--kv-dtype", dest="kv_dtype",
                       choices=VLLM_KV_CACHE_DTYPES, metavar="DTYPE",
                       help="KV-cache dtype, as vLLM's: auto (the model dtype, bfloat16), fp8 "
                            "(= fp8_e4m3), fp8_e4m3, fp8_e5m2, bfloat16; fp8 halves a regular "
                            "model's KV rows, and is fp8_ds_mla (656-byte rows) for DeepSeek "
                            "sparse MLA. Default: per model (fp8_ds_mla for DeepSeek sparse MLA, "
                            "auto otherwise)")
    group.add_argument("--block-size", type=positive_int, metavar="TOKENS",
                       help="tokens per KV-cache block. Default: per model (64 for DeepSeek "
                            "sparse MLA, vLLM's default for attention: 16 on 0.33, 64 on 0.34; "
                            "the Mamba-aligned size for hybrids, vLLM's own for DeepSeek-V4)")
    group.add_argument("-tp", "--tensor-parallel-size", "--tp", dest="tp", type=positive_int,
                       metavar="N", help=TP_HELP)
    group.add_argument("--max-num-seqs", type=positive_int, metavar="N",
                       help="most requests one engine (data-parallel rank) runs at once, as "
                            "vLLM's: the served concurrency is the smaller of it and what the "
                            "pools hold (default: not capped here)")
    group.add_argument("--max-num-batched-tokens", type=positive_int, metavar="N",
                       help="scheduler token budget per step (default 8192)")
    group.add_argument("--max-concurrent-batches", type=positive_int, metavar="N",
                       help="batches in flight, e.g. with pipeline parallelism (default 1)")
    group.add_argument("--num-gpu-blocks-override", type=positive_int, metavar="N",
                       help="use N device blocks whatever the memory holds, as vLLM's (for "
                            "tests and reproducing a run); default: what the memory holds")
    add_deployment_arguments(group)
    add_engine_arguments(parser.add_argument_group("how vLLM runs it (defaults: vLLM's)"))


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    """What to plan, the hardware and serving flags, and the output flags: a subcommand that
    plans one request and prints it needs nothing else."""
    add_source_arguments(parser)
    add_settings_arguments(parser)
    add_output_arguments(parser)


def settings_from(args: argparse.Namespace) -> Settings:
    """The Settings the flags give, before the model is known (the cache dtype and an `auto`
    max_model_len are resolved per model in `resolve_source`)."""
    length = args.max_model_len
    return engine_settings(args, deployment_settings(args, Settings(
        block_size=args.block_size,
        max_model_len=None if length == AUTO else length,
        gpu_mem_bytes=args.gpu_mem,
        host_pool_bytes=getattr(args, "host_pool", None),
        host_pool_layout=getattr(args, "host_pool_layout", None),
        device_buffer_size=args.device_buffer,
        spec_tokens=args.spec_tokens,
        layout=None if args.layout is None else KVCacheLayout(args.layout),
        tp=args.tp,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_concurrent_batches=args.max_concurrent_batches,
    )))


def resolve_source(args: argparse.Namespace) -> Source:
    """The request the arguments name, with the settings flags applied."""
    chosen = [
        flag
        for flag, value in (("MODEL", args.model), ("--request", args.request),
                            ("--hf-config", args.hf_config))
        if value is not None
    ]
    if len(chosen) != 1:
        given = " and ".join(chosen) if chosen else "none"
        raise CommandError(
            f"expected exactly one of MODEL, --request FILE or --hf-config FILE, got {given} "
            f"(presets: {', '.join(preset_names())})"
        )
    settings = settings_from(args)
    refuse_without_config_file(args)
    if args.model is not None:
        preset = load_preset(args.model)
        return _from_architecture(
            args, settings, preset.architecture, preset.title, preset.default_max_model_len
        )
    if args.hf_config is not None:
        arch = load_config_file(args.hf_config, label=config_label(args.hf_config))
        title = f"{args.hf_config}" + (f" ({arch.model_type})" if arch.model_type else "")
        return _from_architecture(args, settings, arch, title, None)
    if args.kv_dtype is not None:
        raise CommandError(
            "--kv-cache-dtype: kv_dtype shapes the layers, which a request file fixes; change "
            "its layers, or plan a model preset or a config.json instead"
        )
    raw = read_input(args.request, "--request")
    request = PlanRequest.model_validate_json(raw)
    if args.max_model_len == AUTO:
        settings = replace(settings, auto_fit=True)
    request = override_request(request, settings)
    return Source(_finished(request, args), f"request {args.request}", None, None)


def _from_architecture(
    args: argparse.Namespace,
    settings: Settings,
    arch: Architecture,
    title: str,
    default_length: Length | None,
) -> Source:
    """A preset's or a config.json's request: the cache dtype resolved for this model, an
    `auto` max_model_len (asked, or the preset's default) fitted to the memory."""
    sparse_mla = isinstance(arch, ModelArchitecture) or (
        isinstance(arch, RegularArchitecture) and arch.compressed_mla
    )
    kv_dtype: KVDtype | None = None
    if args.kv_dtype is not None:
        kv_dtype = resolve_kv_cache_dtype(args.kv_dtype, sparse_mla=sparse_mla)
    auto = args.max_model_len == AUTO or (args.max_model_len is None and default_length == AUTO)
    settings = replace(settings, kv_dtype=kv_dtype, auto_fit=True if auto else settings.auto_fit)
    request, resolution = build_request(arch, settings), None
    if vllm_version(settings) in RESOLVES_LAYOUT:
        request, resolution = resolve_for(args, arch, request,
                                          explicit=settings.layout is not None)
    request = _finished(request, args)
    title = titled(title, settings, request)
    if getattr(args, "specs_from_vllm", False):
        title = f"{title}; {checked_by_vllm(args.hf_config, arch, settings, args.kv_dtype)}"
    sparse = arch if isinstance(arch, ModelArchitecture) else None
    shown = kv_dtype or (DEFAULTS.kv_dtype if sparse_mla else "bfloat16")
    return Source(request, title, sparse, shown, config=arch, platform=resolution)


def _finished(request: PlanRequest, args: argparse.Namespace) -> PlanRequest:
    """`request` with what is set after it is built: a block-count override."""
    if args.num_gpu_blocks_override is None:
        return request
    data = request.model_dump(mode="json")
    data["device"]["num_blocks_override"] = args.num_gpu_blocks_override
    return PlanRequest.model_validate(data)
