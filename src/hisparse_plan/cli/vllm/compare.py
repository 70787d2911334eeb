"""`capacity MODEL --compare`: deployments side by side, as a table, JSON and pictures.

The axes a flag fixes stay fixed (`--gpu`, `-tp`, `-dp`, `--kv-cache-dtype`, `--no-hisparse`);
the others vary: GPUs h100, h200 and b200, tp x dp filling `--node-gpus` GPUs, KV-cache dtypes
auto and fp8, and HiSparse on and off for a sparse-MLA model.
"""

from __future__ import annotations

import argparse

from hisparse_plan.cli.arg_types import AUTO, positive_int
from hisparse_plan.cli.deployment_args import deployment_weights
from hisparse_plan.cli.errors import CommandError
from hisparse_plan.cli.input_files import config_label
from hisparse_plan.cli.render import Column, Renderer, concurrency
from hisparse_plan.cli.sizes import format_size
from hisparse_plan.cli.vllm.layers import checked_by_vllm, refuse_without_config_file
from hisparse_plan.cli.vllm.source import settings_from
from hisparse_plan.operator.deployments import (
    DEFAULT_GPUS,
    DEFAULT_KV_CACHE_DTYPES,
    NODE_GPUS,
    DeploymentComparison,
    DeploymentResult,
    compare_deployments,
    deployment_grid,
)
from hisparse_plan.presets import Architecture, ModelArchitecture, load_config_file, load_preset
from hisparse_plan.presets.catalog import Length, Weights
from hisparse_plan.presets.hardware import DEFAULT_ACTIVATION_RESERVE

BINDS = {"host": "host", "device": "GPU", "both": "both", "gpu": "GPU"}


def _weights(args: argparse.Namespace) -> Weights | int:
    """The model's weights for the GPUs' deployments, from what `plan --gpu` reads them from."""
    try:
        return deployment_weights(args)
    except CommandError as error:
        raise CommandError(f"--compare: {error}; or give the KV memory per GPU (--gpu-mem)"
                           ) from None


def add_compare_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "deployments (--compare)",
        "Every flag that fixes an axis (--gpu, -tp, -dp, --kv-cache-dtype, --no-hisparse) "
        "keeps it fixed; the others vary.",
    )
    group.add_argument("--compare", action="store_true",
                       help="plan the model on every deployment: GPUs "
                            f"{', '.join(DEFAULT_GPUS)} (or --gpu), tp x dp filling a node "
                            "(--node-gpus), KV-cache dtypes auto and fp8, HiSparse on and off "
                            "(sparse-MLA models); one table (or --json) and, with --plot, one "
                            "picture; works for every model")
    group.add_argument("--node-gpus", type=positive_int, metavar="N",
                       help=f"GPUs of one node that tp x dp x pp fills (default {NODE_GPUS})")
    group.add_argument("--plot-memory", metavar="FILE.png",
                       help="with --compare: draw where each GPU's memory goes (weights, "
                            "activation reserve, KV cache, held back) and the host pool per GPU")


def run_compare(args: argparse.Namespace) -> int:
    if args.request is not None or (args.model is None) == (args.hf_config is None):
        raise CommandError("--compare needs exactly one of MODEL or --hf-config FILE: each "
                           "deployment is built from the model's config (a request file fixes "
                           "one deployment's layers; see `plan`)")
    for flag, value in (("--sweep", args.sweep), ("--points", args.points),
                        ("--stage-gpu-mem", args.stage_gpu_mem)):
        if value is not None:
            raise CommandError(f"{flag} cannot combine with --compare")
    refuse_without_config_file(args)
    arch: Architecture
    default_length: Length | None = None
    if args.model is not None:
        preset = load_preset(args.model)
        arch, title = preset.architecture, preset.title
        default_length = preset.default_max_model_len
    else:
        arch = load_config_file(args.hf_config, label=config_label(args.hf_config))
        title = args.hf_config
    given_memory = args.gpu_mem is not None or args.kv_cache_memory is not None
    if given_memory and args.gpu is not None:
        raise CommandError("--compare: --gpu and --gpu-mem/--kv-cache-memory-bytes both set the "
                           "KV memory per GPU; expected one of them")
    weights = None if given_memory else _weights(args)
    gpus: tuple[str | None, ...] = (
        (None,) if given_memory else (args.gpu,) if args.gpu is not None else DEFAULT_GPUS
    )
    sparse = isinstance(arch, ModelArchitecture)
    grid = deployment_grid(
        gpus=gpus,
        tps=None if args.tp is None else (args.tp,),
        dps=None if args.dp is None else (args.dp,),
        pp=args.pp or 1,
        kv_cache_dtypes=(args.kv_dtype,) if args.kv_dtype is not None
        else DEFAULT_KV_CACHE_DTYPES,
        hisparse=(True, False) if sparse and not args.no_hisparse else (False,),
        node_gpus=args.node_gpus or NODE_GPUS,
    )
    # The GPU flags are the grid's here, each deployment's memory its own: the settings are
    # read as if no GPU was named.
    settings = settings_from(argparse.Namespace(**{
        **vars(args), "gpu": None, "gpu_memory_utilization": None, "activation_reserve": None,
        "weights_bytes": None, "parameters": None,
    }))
    if args.specs_from_vllm:
        # The layers are the model's, the same in every deployment: checked once.
        title = f"{title}; {checked_by_vllm(args.hf_config, arch, settings, args.kv_dtype)}"
    reserve = args.activation_reserve
    result = compare_deployments(
        title, arch, grid, settings,
        weights=weights,
        gpu_memory_utilization=args.gpu_memory_utilization,
        activation_reserve=DEFAULT_ACTIVATION_RESERVE if reserve is None else reserve,
        expert_parallel=args.enable_expert_parallel,
        max_num_seqs=args.max_num_seqs,
        auto_max_model_len=args.max_model_len == AUTO or (
            args.max_model_len is None and default_length == AUTO
        ),
    )
    if args.plot is not None or args.plot_memory is not None:
        from hisparse_plan.cli.plot import plot_deployments, plot_memory

        if args.plot is not None:
            plot_deployments(result, args.plot)
        if args.plot_memory is not None:
            plot_memory(result, args.plot_memory)
    if args.json:
        print(result.model_dump_json(indent=2))
        return 0
    out = Renderer(plain=args.plain)
    render_deployments(out, result, expert_parallel=args.enable_expert_parallel)
    for flag, path in (("plot", args.plot), ("memory plot", args.plot_memory)):
        if path is not None:
            out.line(f"{flag}: {path}")
    return 0


def deployment_label(result: DeploymentResult) -> str:
    """`tp2 dp4` (and `pp2` with stages)."""
    d = result.deployment
    return f"tp{d.tp} dp{d.dp}" + (f" pp{d.pp}" if d.pp > 1 else "")


def render_deployments(
    out: Renderer, comparison: DeploymentComparison, *, expert_parallel: bool
) -> None:
    """One row per deployment: the cache dtype planned, each GPU's KV memory, the length, what
    one rank and the node serve, what binds; refusals numbered below."""
    weights = "experts split over tp x dp" if expert_parallel else "weights split over tp"
    cap = "" if comparison.max_num_seqs is None else (
        f", at most {comparison.max_num_seqs} a rank")
    if comparison.sizing is None:
        out.heading(f"{comparison.model}: deployments ({weights}; node = dp x rank{cap})")
    else:
        # The GPU's sizing in the heading; what the columns mean moves below the table.
        out.heading(f"{comparison.model}: deployments, {comparison.sizing}")
    sparse = any(r.deployment.hisparse for r in comparison.results)
    columns = [Column("gpu"), Column("ranks"), Column("kv cache")]
    if sparse:
        columns.append(Column("HiSparse"))
    columns += [Column("KV/GPU", "right"), Column("context", "right"),
                Column("rank", "right"), Column("node", "right"), Column("binds")]
    if sparse:
        columns.append(Column("host/node", "right"))
    rows = []
    notes: dict[str, int] = {}
    """Each distinct refusal, numbered once: rows refused alike share its number."""
    for result in comparison.results:
        d = result.deployment
        row = [d.gpu or "given", deployment_label(result), result.kv_dtype or d.kv_cache_dtype]
        if sparse:
            row.append("on" if d.hisparse else "off")
        kv = "-" if result.kv_cache_bytes is None else format_size(result.kv_cache_bytes)
        if result.refusal is not None:
            number = notes.setdefault(result.refusal, len(notes) + 1)
            row += [kv, "-", "-", "-", f"refused ({number})"]
        else:
            row += [kv, str(result.max_model_len), concurrency(result.per_rank_concurrency),
                    concurrency(result.node_concurrency), BINDS[result.binding or "gpu"]]
        if sparse:
            host = result.node_host_pool_bytes
            row.append("-" if host is None else format_size(host))
        rows.append(row)
    out.table(columns, rows)
    if comparison.sizing is not None:
        out.line(f"{weights}; node = dp x rank{cap}")
    for reason, number in notes.items():
        out.line(f"({number}) {reason}")
