"""Where a request comes from (a preset, a config.json, a request file) and the flags that
shape it. Shared by every subcommand that plans."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Final

from hisparse_plan.cli.arg_types import (
    non_negative_int,
    positive_int,
    positive_size,
    positive_tokens,
    size_arg,
)
from hisparse_plan.cli.deployment_args import add_deployment_arguments, deployment_settings
from hisparse_plan.cli.engine_args import add_engine_arguments, engine_settings, titled
from hisparse_plan.cli.errors import CommandError
from hisparse_plan.cli.input_files import check_regular_file, read_input
from hisparse_plan.cli.sizes import SIZE_HELP
from hisparse_plan.models import KVCacheLayout, PlanRequest
from hisparse_plan.presets import (
    DEFAULTS,
    KV_DTYPES,
    KVDtype,
    ModelArchitecture,
    Settings,
    build_request,
    load_config_file,
    load_preset,
    override_request,
    preset_names,
)

TP_HELP: Final = (
    "tensor-parallel ranks on one node (default 1). With N > 1 the ranks map ONE host pool "
    "(shared_host_pool, blocks aligned to 4096 bytes) and --host-pool is that node-wide pool, "
    "not a per-rank one; --gpu-mem stays per GPU. Every rank keeps the same replicated MLA "
    "cache, so the plan and its concurrency hold for each rank and for the node"
)


@dataclass(frozen=True, slots=True)
class Source:
    """A request and what it was built from."""

    request: PlanRequest
    title: str
    architecture: ModelArchitecture | None
    kv_dtype: KVDtype | None


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


def add_settings_arguments(parser: argparse.ArgumentParser, *, host_pool: bool = True) -> None:
    group = parser.add_argument_group(
        "hardware and serving (defaults: the preset request; with --request: the file's)",
        SIZE_HELP,
    )
    group.add_argument("--gpu-mem", type=size_arg, metavar="SIZE",
                       help="GPU memory for the KV cache, per GPU (preset default 60GiB)")
    if host_pool:
        group.add_argument("--host-pool", type=positive_size, metavar="SIZE",
                           help="pinned host (DRAM) pool for the source cache (preset default "
                                "64GiB); with --tp N > 1, the one pool the node's ranks share")
    group.add_argument("--max-model-len", type=positive_tokens, metavar="TOKENS",
                       help="longest request, e.g. 131072 or 128k (preset default: the model's "
                            "max_position_embeddings)")
    group.add_argument("--spec-tokens", type=non_negative_int, metavar="N",
                       help="speculative tokens per decode step (default 0): decode queries are "
                            "1 + N rows")
    group.add_argument("--device-buffer", type=positive_int, metavar="ROWS",
                       help="hot rows per request (default (1 + N + 1) * index_topk)")
    group.add_argument("--layout", type=str.upper, choices=[lay.value for lay in KVCacheLayout],
                       help="device KV-cache layout (preset default BLNHC)")
    group.add_argument("--kv-dtype", choices=KV_DTYPES,
                       help="KV-cache dtype of a preset or config.json (default fp8_ds_mla)")
    group.add_argument("--block-size", type=positive_int, metavar="TOKENS",
                       help="tokens per block of a preset or config.json (default 64)")
    group.add_argument("--tp", type=positive_int, metavar="N", help=TP_HELP)
    group.add_argument("--max-num-batched-tokens", type=positive_int, metavar="N",
                       help="scheduler token budget per step (default 8192)")
    group.add_argument("--max-concurrent-batches", type=positive_int, metavar="N",
                       help="batches in flight, e.g. with pipeline parallelism (default 1)")
    add_deployment_arguments(group)
    add_engine_arguments(parser.add_argument_group("how vLLM runs it (defaults: vLLM's)"))


def add_output_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON for machines")
    parser.add_argument("--plain", action="store_true",
                        help="plain text tables, even when rich is installed")


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    """What to plan, the hardware and serving flags, and the output flags: a subcommand that
    plans one request and prints it needs nothing else."""
    add_source_arguments(parser)
    add_settings_arguments(parser)
    add_output_arguments(parser)


def settings_from(args: argparse.Namespace) -> Settings:
    return engine_settings(args, deployment_settings(args, Settings(
        kv_dtype=args.kv_dtype,
        block_size=args.block_size,
        max_model_len=args.max_model_len,
        gpu_mem_bytes=args.gpu_mem,
        host_pool_bytes=getattr(args, "host_pool", None),
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
    kv_dtype = settings.kv_dtype or DEFAULTS.kv_dtype
    if args.model is not None:
        preset = load_preset(args.model)
        request = build_request(preset.architecture, settings)
        title = titled(preset.title, settings, request)
        return Source(request, title, preset.sparse_architecture, kv_dtype)
    if args.hf_config is not None:
        check_regular_file(args.hf_config, "--hf-config")
        arch = load_config_file(args.hf_config)
        request = build_request(arch, settings)
        title = titled(
            f"{args.hf_config}" + (f" ({arch.model_type})" if arch.model_type else ""),
            settings, request,
        )
        sparse = arch if isinstance(arch, ModelArchitecture) else None
        return Source(request, title, sparse, kv_dtype)
    raw = read_input(args.request, "--request")
    request = override_request(PlanRequest.model_validate_json(raw), settings)
    return Source(request, f"request {args.request}", None, None)
