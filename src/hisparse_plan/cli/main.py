"""The `hisparse-plan` command: argument parsing and the one place refusals become exit codes
(EXIT_CODES below). Whatever goes wrong, the operator sees one `error: ...` line on stderr,
never a traceback (unless HISPARSE_PLAN_DEBUG=1 asks for one).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import warnings
from collections.abc import Sequence
from typing import NoReturn

from pydantic import ValidationError

from hisparse_plan import __version__
from hisparse_plan.cli.command import Command
from hisparse_plan.cli.commands import (
    capacity,
    diff,
    docs,
    explain,
    manifest,
    models,
    plan,
    schema,
    transfer,
    tune,
    verify,
)
from hisparse_plan.cli.errors import (
    DIGITS_HINT,
    CheckFailed,
    CommandError,
    one_line,
    too_many_digits,
)
from hisparse_plan.cli.printable import printable
from hisparse_plan.cli.sizes import SIZE_HELP
from hisparse_plan.cli.stderr import EXIT_INTERRUPTED, interrupted, say
from hisparse_plan.errors import HisparsePlanError, PlanWarning
from hisparse_plan.models.json_input import EXCERPT_CHARS, cut

COMMANDS: tuple[Command, ...] = (
    plan.COMMAND,
    capacity.COMMAND,
    tune.COMMAND,
    explain.COMMAND,
    schema.COMMAND,
    verify.COMMAND,
    manifest.COMMAND,
    diff.COMMAND,
    transfer.COMMAND,
    models.COMMAND,
    docs.COMMAND,
)
DEBUG_ENV = "HISPARSE_PLAN_DEBUG"
"""Set to 1 to let an internal error's traceback through."""
EXIT_DONE, EXIT_FAULT, EXIT_REFUSED = 0, 1, 2
EXIT_CODES = (
    f"Exit codes: {EXIT_DONE} done; {EXIT_FAULT} a check ran and found a fault (verify; diff: "
    f"the plans are not transfer-compatible); {EXIT_REFUSED} a refusal (bad arguments or "
    "input, a request the planner rejects, a missing extra, an internal error), always one "
    f"'error: ...' line on stderr; {EXIT_INTERRUPTED} interrupted (Ctrl-C)"
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, like every other refusal (argparse would print the usage first).
        # argparse quotes the bad value whole: keep a short excerpt of it.
        text = printable(" ".join(cut(DIGITS_HINT.sub("", message), 2 * EXCERPT_CHARS).split()))
        self.exit(EXIT_REFUSED, f"error: {text} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="hisparse-plan",
        description="Plan where every byte of an LLM's KV cache lives, for vLLM and SGLang: "
        "regular models, and sparse-MLA models with HiSparse's host pool; see what a "
        "deployment holds, and what more memory would buy.",
        epilog=f"{SIZE_HELP}. {EXIT_CODES}. The guides: hisparse-plan docs --list.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(
        dest="command", required=True, parser_class=_Parser, metavar="COMMAND"
    )
    for command in COMMANDS:
        sub = commands.add_parser(
            command.name, help=command.help, description=command.description,
            epilog=f"{SIZE_HELP}. {EXIT_CODES}.",
        )
        command.configure(sub)
        sub.set_defaults(run=command.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The command, once imported (`launch.main` imports it inside its own Ctrl-C guard)."""
    try:
        return _main(argv)
    except KeyboardInterrupt:  # anywhere: parsing, planning, allocating, printing warnings
        return interrupted()


def _main(argv: Sequence[str] | None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as stop:  # --help, --version, or a usage error already printed
        return stop.code if isinstance(stop.code, int) else EXIT_DONE
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", PlanWarning)
        status = _run(args)
    shown: set[str] = set()
    for warning in caught:
        if not issubclass(warning.category, PlanWarning):
            continue  # a dependency's deprecation notice is not the operator's business
        message = one_line(PlanWarning(str(warning.message)))
        if message not in shown:
            shown.add(message)
            say(f"warning: {message}")
    return status


def _run(args: argparse.Namespace) -> int:
    if sys.stdout is None:
        # Descriptor 1 was closed (`>&-`): print would drop every line without a word.
        say("error: standard output is closed; expected a terminal, file or pipe to print to")
        return EXIT_REFUSED
    try:
        status: int = args.run(args)
        return status
    except BrokenPipeError:
        # The reader went away (`| head`): not an error; silence the flush at exit.
        _stop_output()
        return EXIT_DONE
    except (HisparsePlanError, ValidationError, CommandError, OSError,
            json.JSONDecodeError) as error:
        say(f"error: {one_line(error)}")
        return EXIT_REFUSED
    except CheckFailed as error:
        say(f"error: {one_line(error)}")
        return EXIT_FAULT
    except MemoryError:
        say("error: out of memory (is the input, or a pool, far larger than intended?)")
        return EXIT_REFUSED
    except RecursionError:
        say("error: input nested too deeply to process")
        return EXIT_REFUSED
    except Exception as error:
        if too_many_digits(error):  # wherever the input was parsed: bad input, not a bug
            say(f"error: a number in the input is too long: {one_line(error)}")
            return EXIT_REFUSED
        # Input that slipped past validation and broke something deeper (an AttributeError,
        # a TypeError) is still refused in one line, never shown as a traceback.
        if os.environ.get(DEBUG_ENV) == "1":
            raise
        say(
            f"error: internal error, please report it: {type(error).__name__}: "
            f"{one_line(error)} (set {DEBUG_ENV}=1 for the traceback)"
        )
        return EXIT_REFUSED


def _stop_output() -> None:
    """Point stdout at /dev/null, so that flushing what is left at exit cannot fail again."""
    # OSError, ValueError: stdout closed, or not a real file (captured in tests).
    with contextlib.suppress(OSError, ValueError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


if __name__ == "__main__":
    sys.exit(main())
