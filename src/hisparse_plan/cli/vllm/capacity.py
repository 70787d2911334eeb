"""vLLM's part of `hisparse-plan capacity` (without --engine): HiSparse against the all-GPU
baseline, a regular model's own capacity, a sweep, or deployments side by side (--compare)."""

from __future__ import annotations

import argparse
import dataclasses

from hisparse_plan.cli.arg_types import AUTO
from hisparse_plan.cli.deployment_args import sizing_from
from hisparse_plan.cli.errors import CommandError
from hisparse_plan.cli.render import Column, Renderer, concurrency
from hisparse_plan.cli.serving import show_serving
from hisparse_plan.cli.sizes import format_size, parse_size, parse_tokens
from hisparse_plan.cli.vllm.compare import add_compare_arguments, run_compare
from hisparse_plan.cli.vllm.source import Source, resolve_source
from hisparse_plan.errors import PlanError
from hisparse_plan.models import PlanRequest
from hisparse_plan.operator import (
    SWEEP_AXES,
    CapacityComparison,
    Sweep,
    SweepAxis,
    compare,
    default_points,
    fitted_request,
    regular_capacity,
    sweep,
)
from hisparse_plan.targets.vllm.rules.host import host_budget_bytes

BINDS = {"host": "host pool", "device": "GPU", "both": "both"}
MAX_POINTS = 1000
"""Sweep points one --points may give: each plans the model twice, and a curve needs far fewer."""


def add_capacity_arguments(parser: argparse.ArgumentParser) -> None:
    """The sweep and the --compare flags."""
    group = parser.add_argument_group("sweep")
    group.add_argument("--sweep", choices=SWEEP_AXES,
                       help="compare along context length or host pool size")
    group.add_argument("--points", metavar="LIST",
                       help="comma-separated sweep points: token counts (8k,32k,131072) for "
                            "max-model-len, sizes (64GiB,256GiB) for host-pool; default: "
                            "doubling from 4096 tokens up to --max-model-len, or 16GiB to 1TiB; "
                            f"at most {MAX_POINTS} points")
    group.add_argument("--plot", metavar="FILE.png",
                       help="draw the sweep or the --compare table as a PNG (needs the plot "
                            "extra: matplotlib)")
    add_compare_arguments(parser)


def run_capacity(args: argparse.Namespace) -> int:
    """`capacity` without --engine: HiSparse against the all-GPU baseline (or a regular
    model's own capacity), at one point or a sweep; with --compare, deployments side by side."""
    if args.compare:
        return run_compare(args)
    if args.plot_memory is not None or args.node_gpus is not None:
        raise CommandError("--plot-memory and --node-gpus need --compare")
    if args.sweep is None and (args.plot is not None or args.points is not None):
        flag = "--plot" if args.plot is not None else "--points"
        raise CommandError(f"{flag} needs --sweep max-model-len or --sweep host-pool")
    if args.sweep == "host-pool" and getattr(args, "host_pool", None) is not None:
        raise CommandError(
            "--host-pool cannot be combined with --sweep host-pool: the sweep sets the host "
            "pool at each point; give the sizes with --points"
        )
    source = resolve_source(args)
    # --max-model-len auto: HiSparse, its baseline and a sweep compare at the fitted length.
    source = dataclasses.replace(source, request=fitted_request(source.request))
    if args.gpu is not None:
        source = dataclasses.replace(source, title=f"{source.title} on {args.gpu}, "
                                                   f"{gpu_sizing(args)}")
    out = Renderer(plain=args.plain)
    if args.sweep is None:
        if source.request.hisparse is None:
            return run_regular(args, out, source)
        comparison = compare(source.request)
        if args.json:
            print(comparison.model_dump_json(indent=2))
        else:
            render_comparison(out, source, comparison)
            show_serving(out, args, comparison.hisparse.max_concurrency)
        return 0
    axis: SweepAxis = args.sweep
    trained = source.config.max_position_embeddings if source.config is not None else None
    chosen = args.max_model_len if isinstance(args.max_model_len, int) else None
    longest = chosen or (
        source.request.model.max_model_len if args.max_model_len == AUTO else trained
    )
    values = (
        _points(axis, args.points)
        if args.points is not None
        else default_points(axis, source.request, longest)
    )
    result = sweep(source.request, axis, values, max_position_embeddings=trained,
                   allow_long_context=args.allow_long_context)
    if args.plot is not None:
        from hisparse_plan.cli.plot import plot_sweep

        plot_sweep(result, args.plot, title=_setting(source.request, axis, source.title))
    if args.json:
        print(result.model_dump_json(indent=2))
    else:
        render_sweep(out, source, result)
        if args.plot is not None:
            out.line(f"plot: {args.plot}")
    return 0


def run_regular(args: argparse.Namespace, out: Renderer, source: Source) -> int:
    """`capacity` of a regular model: its own plan's capacity (every cache is on the GPU, so
    there is no baseline to set it against)."""
    found = regular_capacity(source.request)
    if found.refusal is not None:
        raise PlanError(found.refusal)
    if args.json:
        print(found.model_dump_json(indent=2))
        return 0
    out.heading(_setting(source.request, None, source.title))
    out.table(
        [Column(""), Column("max concurrency", "right"), Column("blocks/request", "right"),
         Column("blocks", "right"), Column("bytes/block", "right")],
        [["all on the GPU (no HiSparse)", concurrency(found.max_concurrency),
          str(found.blocks_per_request), str(found.num_blocks), str(found.bytes_per_block)]],
    )
    show_serving(out, args, found.max_concurrency)
    return 0


def gpu_sizing(args: argparse.Namespace) -> str:
    """What vLLM's KV memory on the --gpu assumed: its sizing mode and share, or a given size."""
    if args.kv_cache_memory is not None or args.gpu_mem is not None:
        return "KV memory given"
    return sizing_from(args).words


def _points(axis: SweepAxis, text: str) -> list[int]:
    parse = parse_tokens if axis == "max-model-len" else parse_size
    parts = [part for part in text.split(",") if part.strip()]
    if len(parts) > MAX_POINTS:
        raise CommandError(
            f"--points: expected at most {MAX_POINTS} points, got {len(parts)} (each point "
            "plans the model again; sweep a coarser range)"
        )
    try:
        values = [parse(part) for part in parts]
    except ValueError as error:
        raise CommandError(f"--points: {error}") from None
    if not values or min(values) <= 0:
        raise CommandError(f"--points: expected values above 0, got {text!r}")
    return values


def _setting(request: PlanRequest, axis: SweepAxis | None, title: str) -> str:
    """The title and the fixed inputs: the swept one is left out."""
    parts = [f"{format_size(request.device.available_bytes)} GPU"]
    if axis != "host-pool" and request.hisparse is not None:
        budget = host_budget_bytes(request.hisparse.host_pool_gib)
        parts.append(f"{format_size(budget)} host pool")
    if axis != "max-model-len":
        parts.append(f"max_model_len {request.model.max_model_len}")
    return f"{title}: " + ", ".join(parts)


def render_comparison(out: Renderer, source: Source, comparison: CapacityComparison) -> None:
    out.heading(_setting(source.request, None, source.title))
    hisparse = comparison.hisparse
    baseline = comparison.baseline
    out.table(
        [Column(""), Column("max concurrency", "right"), Column("steady state", "right")],
        [
            ["HiSparse", concurrency(hisparse.max_concurrency),
             concurrency(hisparse.steady_state_concurrency)],
            ["all-GPU baseline", concurrency(baseline.max_concurrency), "-"],
        ],
    )
    out.line(f"ratio (HiSparse / baseline): {_ratio(comparison.ratio)}")
    out.line(f"HiSparse binds on: {BINDS[comparison.binding]}")
    if baseline.refusal is not None:
        out.line(f"baseline refused by the planner: {baseline.refusal}")
    else:
        out.line(
            f"baseline (planned without HiSparse): {baseline.num_blocks} blocks of "
            f"{baseline.bytes_per_block} bytes, {baseline.blocks_per_request} blocks per request"
        )


def _ratio(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"


def render_sweep(out: Renderer, source: Source, result: Sweep) -> None:
    out.heading(_setting(source.request, result.axis, source.title))
    if source.request.hisparse is None:
        render_regular_sweep(out, result)
        return
    head = "max_model_len" if result.axis == "max-model-len" else "host pool"
    rows = []
    notes = []
    for point in result.points:
        value = str(point.value) if result.axis == "max-model-len" else format_size(point.value)
        found = point.comparison
        if found is None:
            rows.append([value, "-", "-", "-", "-", "refused"])
            notes.append(f"{value}: {point.error}")
            continue
        rows.append([
            value,
            concurrency(found.hisparse.max_concurrency),
            concurrency(found.hisparse.steady_state_concurrency),
            concurrency(found.baseline.max_concurrency),
            _ratio(found.ratio),
            BINDS[found.binding],
        ])
    out.table(
        [Column(head, "right"), Column("HiSparse max", "right"), Column("steady", "right"),
         Column("baseline", "right"), Column("ratio", "right"), Column("binds")],
        rows,
    )
    for note in notes:
        out.line(f"refused at {note}")


def render_regular_sweep(out: Renderer, result: Sweep) -> None:
    """A regular model's capacity at each length: one plan per point, no baseline."""
    rows = []
    notes = []
    for point in result.points:
        found = point.regular
        if found is None:
            rows.append([str(point.value), "-", "-", "-"])
            notes.append(f"{point.value}: {point.error}")
            continue
        rows.append([str(point.value), concurrency(found.max_concurrency),
                     str(found.blocks_per_request), str(found.num_blocks)])
    out.table(
        [Column("max_model_len", "right"), Column("max concurrency", "right"),
         Column("blocks/request", "right"), Column("blocks", "right")],
        rows,
    )
    for note in notes:
        out.line(f"refused at {note}")
