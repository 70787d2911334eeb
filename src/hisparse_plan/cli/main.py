"""The `hisparse-plan` command: argument parsing and the one place refusals become exit codes.

Exit codes: 0 done; 1 verify found a fault (or an internal error); 2 a refusal (bad
arguments, a request the planner rejects, a missing extra), always as one `error: ...` line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from collections.abc import Sequence
from typing import NoReturn

from pydantic import ValidationError

from hisparse_plan import __version__
from hisparse_plan.cli.command import Command
from hisparse_plan.cli.commands import capacity, explain, models, plan, schema, tune, verify
from hisparse_plan.cli.errors import CheckFailed, CommandError, one_line
from hisparse_plan.cli.sizes import SIZE_HELP
from hisparse_plan.errors import PlanError, PlanWarning

COMMANDS: tuple[Command, ...] = (
    plan.COMMAND,
    capacity.COMMAND,
    tune.COMMAND,
    explain.COMMAND,
    schema.COMMAND,
    verify.COMMAND,
    models.COMMAND,
)
DEBUG_ENV = "HISPARSE_PLAN_DEBUG"
"""Set to 1 to let an internal error's traceback through."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, like every other refusal (argparse would print the usage first).
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="hisparse-plan",
        description="Plan a HiSparse sparse-MLA KV cache, and see what it buys.",
        epilog=SIZE_HELP + ".",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(
        dest="command", required=True, parser_class=_Parser, metavar="COMMAND"
    )
    for command in COMMANDS:
        sub = commands.add_parser(
            command.name, help=command.help, description=command.description,
            epilog=SIZE_HELP + ".",
        )
        command.configure(sub)
        sub.set_defaults(run=command.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as stop:  # --help, --version, or a usage error already printed
        return stop.code if isinstance(stop.code, int) else 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", PlanWarning)
        status = _run(args)
    shown: set[str] = set()
    for warning in caught:
        if not issubclass(warning.category, PlanWarning):
            continue  # a dependency's deprecation notice is not the operator's business
        message = " ".join(str(warning.message).split())
        if message not in shown:
            shown.add(message)
            print(f"warning: {message}", file=sys.stderr)
    return status


def _run(args: argparse.Namespace) -> int:
    try:
        status: int = args.run(args)
        return status
    except BrokenPipeError:
        # The reader went away (`| head`): not an error; silence the flush at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (PlanError, ValidationError, CommandError, OSError, json.JSONDecodeError) as error:
        print(f"error: {one_line(error)}", file=sys.stderr)
        return 2
    except CheckFailed as error:
        print(f"error: {one_line(error)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except Exception as error:
        if os.environ.get(DEBUG_ENV) == "1":
            raise
        print(
            f"error: internal error, please report it: {type(error).__name__}: "
            f"{one_line(error)} (set {DEBUG_ENV}=1 for the traceback)",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
