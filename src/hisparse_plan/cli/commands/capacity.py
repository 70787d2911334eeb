"""`hisparse-plan capacity`: HiSparse against the all-GPU baseline, at one point or a sweep."""

from __future__ import annotations

import argparse
import dataclasses
import json

from hisparse_plan.cli.arg_types import AUTO
from hisparse_plan.cli.command import Command
from hisparse_plan.cli.compare import add_compare_arguments, run_compare
from hisparse_plan.cli.engines import Engine, Figures, add_engine_choice, chosen_engines
from hisparse_plan.cli.errors import CommandError
from hisparse_plan.cli.render import Column, Renderer, concurrency
from hisparse_plan.cli.serving import render_serving, serving_from
from hisparse_plan.cli.sglang_render import render_engines
from hisparse_plan.cli.sglang_source import add_sglang_arguments
from hisparse_plan.cli.sizes import format_size, parse_size, parse_tokens
from hisparse_plan.cli.source import (
    Source,
    add_output_arguments,
    add_settings_arguments,
    add_source_arguments,
    resolve_source,
)
from hisparse_plan.models import PlanRequest
from hisparse_plan.operator import (
    SWEEP_AXES,
    CapacityComparison,
    Sweep,
    SweepAxis,
    compare,
    default_points,
    fitted_request,
    sweep,
)
from hisparse_plan.targets.vllm.rules.host import host_budget_bytes

BINDS = {"host": "host pool", "device": "GPU", "both": "both"}
MAX_POINTS = 1000
"""Sweep points one --points may give: each plans the model twice, and a curve needs far fewer."""


def configure(parser: argparse.ArgumentParser) -> None:
    add_source_arguments(parser)
    add_settings_arguments(parser)
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
    add_engine_choice(parser, several=True)
    add_sglang_arguments(parser)
    add_output_arguments(parser)


def run(args: argparse.Namespace) -> int:
    engines = chosen_engines(args, several=True)
    if args.engine is not None:
        return run_engines(args, engines)
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
    out = Renderer(plain=args.plain)
    if args.sweep is None:
        comparison = compare(source.request)
        if args.json:
            print(comparison.model_dump_json(indent=2))
        else:
            render_comparison(out, source, comparison)
            serving = serving_from(args)
            if serving.shown:
                out.line()
                render_serving(out, serving, comparison.hisparse.max_concurrency)
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


def run_engines(args: argparse.Namespace, engines: list[Engine]) -> int:
    """`capacity --engine ...`: each engine's pools for the same model, GPU and ranks. Side by
    side, the later engines are asked the first one's question: its cache element type and
    whether HiSparse is on, unless the flags say."""
    figures: list[Figures] = []
    notes: list[str] = []
    for engine in engines:
        asked = args
        if figures:
            asked, note = same_question(args, figures[0], engines[0].title)
            notes += [f"{engine.title}: {note}"] if note else []
        figures.append(engine.figures(asked))
    if args.json:
        print(json.dumps([dataclasses.asdict(f) for f in figures], indent=2))
        return 0
    model = args.model or args.hf_config or args.request
    where = f"{args.gpu} x tp {args.tp or 1}" if args.gpu else f"tp {args.tp or 1}"
    out = Renderer(plain=args.plain)
    render_engines(out, f"{model} on {where}: one rank's KV pools", figures)
    for note in notes:
        out.line(note)
    for engine, figure in zip(engines, figures, strict=True):
        if figure.defaults:
            out.line(f"{engine.title} defaults: {figure.defaults}")
    return 0


FP8_ROWS = ("fp8", "fp8_e4m3", "fp8_ds_mla", "uint8")
"""Cache element types (as vLLM's figures name them) that are fp8 rows."""


def same_question(
    args: argparse.Namespace, first: Figures, title: str
) -> tuple[argparse.Namespace, str]:
    """The flags for a second engine, with the first engine's fp8 rows and HiSparse where the
    flags leave them to defaults; and a note saying what was carried over."""
    carried = []
    asked = argparse.Namespace(**vars(args))
    if args.kv_dtype is None and first.kv_dtype.split(" ")[0] in FP8_ROWS:
        asked.kv_dtype = "fp8"
        carried.append("fp8 rows")
    hisparse_flags = (getattr(args, "enable_hisparse", False), getattr(args, "no_hisparse", False))
    if first.host_bytes is not None and not any(hisparse_flags):
        asked.enable_hisparse = True
        carried.append("HiSparse")
    if not carried:
        return asked, ""
    return asked, (f"planned with {' and '.join(carried)} as {title} is, for the same "
                   "question (--kv-cache-dtype and --no-hisparse change both)")


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


COMMAND = Command(
    name="capacity",
    help="HiSparse against the all-GPU baseline on the same GPU memory",
    description="Concurrent max_model_len requests with HiSparse and with every layer "
    "(source, indexer and any other) on the GPU, side by side, and their ratio. The baseline "
    "is the same request planned without HiSparse (a regular plan), not a formula. With "
    "--compare: deployments side by side (GPU x tensor-parallel x data-parallel x KV-cache "
    "dtype, and HiSparse on and off), for any model.",
    configure=configure,
    run=run,
)
