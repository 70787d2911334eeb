"""`hisparse-plan explain`: every number of a plan, with its formula and inputs."""

from __future__ import annotations

import argparse

from hisparse_plan.cli.command import Command
from hisparse_plan.cli.engines import add_engines_arguments, chosen_engines
from hisparse_plan.cli.errors import CommandError
from hisparse_plan.cli.render import Column, Renderer, add_output_arguments
from hisparse_plan.models.json_input import excerpt
from hisparse_plan.operator import Explanation, Step


def configure(parser: argparse.ArgumentParser) -> None:
    add_engines_arguments(parser, several=False)
    parser.add_argument("--section", metavar="WORD",
                        help="only the sections whose title contains WORD: model config, pages, "
                             "groups, pools (or host, device), admission, tensors, capacity; "
                             "with --engine sglang: model, defaults, budget, tokens, pools, "
                             "capacity")
    add_output_arguments(parser)


def run(args: argparse.Namespace) -> int:
    (engine,) = chosen_engines(args, several=False)
    title, result = engine.explain(args)
    if args.section is not None:
        result = _sections(result, args.section)
    if args.json:
        print(result.model_dump_json(indent=2))
        return 0
    out = Renderer(plain=args.plain)
    out.heading(f"{title}: where every number comes from")
    for section in result.sections:
        out.table(
            [Column("number"), Column("value", "right"), Column("formula [inputs]")],
            [[step.name, value_text(step.value), formula_text(step)] for step in section.steps],
            title=section.title,
        )
    return 0


def _sections(result: Explanation, word: str) -> Explanation:
    """The sections whose title contains `word` (any case); a word that matches none is a
    refusal listing the titles there are, not an empty answer."""
    wanted = word.strip().lower()
    # The name before the docs reference: "see docs/..." would match every section.
    kept = [s for s in result.sections if wanted and wanted in s.title.split(" (")[0].lower()]
    if not kept:
        names = ", ".join(s.title.split(" (")[0] for s in result.sections)
        raise CommandError(
            f"--section {excerpt(word, 80)} matches no section; expected a word from one of: "
            f"{names}"
        )
    return Explanation(sections=kept)


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
    description="Show what each planning stage decided and why (vLLM: group, size, admit, place, "
    "report; SGLang, with --engine sglang: read, resolve, size, place, report; "
    "docs/planning-rules.md), with the formula and its inputs beside every number; for a preset "
    "or config.json planned for vLLM, start from the config.json fields.",
    configure=configure,
    run=run,
)
