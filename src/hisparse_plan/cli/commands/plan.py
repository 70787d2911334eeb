"""`hisparse-plan plan`: a readable summary of a plan, or the whole plan as JSON."""

from __future__ import annotations

import argparse

from hisparse_plan.cli.command import Command
from hisparse_plan.cli.engines import add_engines_arguments, chosen_engines
from hisparse_plan.cli.render import add_output_arguments


def configure(parser: argparse.ArgumentParser) -> None:
    add_engines_arguments(parser, several=False)
    add_output_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """The chosen engine's plan, shown its own way (cli/vllm/plan_command.py,
    cli/sglang/plan_command.py)."""
    (engine,) = chosen_engines(args, several=False)
    return engine.plan(args)


COMMAND = Command(
    name="plan",
    help="plan a model preset, a config.json or a request file",
    description="Plan where every byte of the KV cache lives, and print a summary (groups, "
    "pools, one request's footprint, capacity) or, with --json, the whole plan.",
    configure=configure,
    run=run,
)
