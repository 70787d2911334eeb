"""`hisparse-plan explain`: every number of a plan, with its formula and inputs."""

from __future__ import annotations

import argparse

from hisparse_plan.cli.command import Command
from hisparse_plan.cli.render import Column, Renderer
from hisparse_plan.cli.source import (
    add_output_arguments,
    add_settings_arguments,
    add_source_arguments,
    resolve_source,
)
from hisparse_plan.operator import Explanation, Step, explain


def configure(parser: argparse.ArgumentParser) -> None:
    add_source_arguments(parser)
    add_settings_arguments(parser)
    parser.add_argument("--section", metavar="WORD",
                        help="only the sections whose title contains WORD (e.g. host, tensors)")
    add_output_arguments(parser)


def run(args: argparse.Namespace) -> int:
    source = resolve_source(args)
    result = explain(source.request, architecture=source.architecture, kv_dtype=source.kv_dtype)
    if args.section is not None:
        word = args.section.lower()
        result = Explanation(
            sections=[s for s in result.sections if word in s.title.lower()]
        )
    if args.json:
        print(result.model_dump_json(indent=2))
        return 0
    out = Renderer(plain=args.plain)
    out.heading(f"{source.title}: where every number comes from")
    for section in result.sections:
        out.table(
            [Column("number"), Column("value", "right"), Column("formula [inputs]")],
            [[step.name, value_text(step.value), formula_text(step)] for step in section.steps],
            title=section.title,
        )
    if not result.sections:
        out.line(f"no section title contains {args.section!r}")
    return 0


def value_text(value: int | float | str) -> str:
    return f"{value:.10g}" if isinstance(value, float) else str(value)


def formula_text(step: Step) -> str:
    if not step.inputs:
        return step.formula
    inputs = ", ".join(
        f"{name}={value_text(value) if not isinstance(value, str) else value}"
        for name, value in step.inputs.items()
    )
    return f"{step.formula} [{inputs}]"


COMMAND = Command(
    name="explain",
    help="every number of a plan with the formula and inputs it came from",
    description="Recompute every number of the plan from its inputs with the planner's own "
    "rules (SPEC 5) and show the formula beside it; for a preset or config.json, start from "
    "the config.json fields.",
    configure=configure,
    run=run,
)
