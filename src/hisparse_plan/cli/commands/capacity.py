"""`hisparse-plan capacity`: HiSparse against the all-GPU baseline (or a regular model's own
capacity), at one point or a sweep; or, with --engine, each engine's pools side by side."""

from __future__ import annotations

import argparse
import dataclasses
import json

from hisparse_plan.cli.command import Command
from hisparse_plan.cli.engines import (
    Engine,
    Figures,
    add_capacity_arguments,
    add_engines_arguments,
    chosen_engines,
    run_capacity,
)
from hisparse_plan.cli.figures import render_engines
from hisparse_plan.cli.render import Renderer, add_output_arguments


def configure(parser: argparse.ArgumentParser) -> None:
    add_engines_arguments(parser, several=True, between=add_capacity_arguments)
    add_output_arguments(parser)


def run(args: argparse.Namespace) -> int:
    engines = chosen_engines(args, several=True)
    if args.engine is not None:
        return run_engines(args, engines)
    return run_capacity(args)


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
    ranks = f"tp {args.tp or 1}" + (f" x dp {args.dp}" if (args.dp or 1) > 1 else "")
    where = f"{args.gpu} x {ranks}" if args.gpu else ranks
    shown = "one rank's KV pools" + (" and the node's" if (args.dp or 1) > 1 else "")
    heading = f"{model} on {where}: {shown}"
    if args.gpu:
        heading += "".join(f"; {engine.title}: {sizing}" for engine in engines
                           if (sizing := engine.gpu_note(args)) is not None)
    out = Renderer(plain=args.plain)
    render_engines(out, heading, figures, [engine.column for engine in engines])
    for note in notes:
        out.line(note)
    if (args.dp or 1) > 1:
        for figure, engine in zip(figures, engines, strict=True):
            if figure.node_concurrency is None:
                out.line(f"{engine.title}: -dp is not planned for this engine here; its node "
                         "figures are left out")
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


COMMAND = Command(
    name="capacity",
    help="concurrent requests: HiSparse against the all-GPU baseline, or a regular model's",
    description="Concurrent max_model_len requests with HiSparse and with every layer "
    "(source, indexer and any other) on the GPU, side by side, and their ratio. The baseline "
    "is the same request planned without HiSparse (a regular plan), not a formula. A regular "
    "model (no HiSparse) gets its own plan's concurrency, and --sweep max-model-len. With "
    "--compare: deployments side by side (GPU x tensor-parallel x data-parallel x KV-cache "
    "dtype, and HiSparse on and off), for any model.",
    configure=configure,
    run=run,
)
