"""The `hisparse-plan` command's first code. It imports nothing heavy itself: every command,
model and dependency is imported inside `main`'s Ctrl-C guard, so that an interrupt at any
moment, start-up included, is one line on stderr and exit code 130, never a traceback."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Sequence
from typing import Final

EXIT_INTERRUPTED: Final = 130
INTERRUPTED: Final = "error: interrupted"


def say(line: str) -> None:
    """One line on stderr; nothing at all when stderr is closed (`2>&-`), where print would
    fall back to stdout and mix a message into the command's output."""
    stream = sys.stderr
    if stream is None:
        return
    # OSError, ValueError: the descriptor or the file object was closed under us.
    with contextlib.suppress(OSError, ValueError):
        print(line, file=stream)


def interrupted() -> int:
    """Ctrl-C, wherever it came: the one line, and the exit code that says so."""
    say(INTERRUPTED)
    return EXIT_INTERRUPTED


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command (`hisparse_plan.cli.main.main`), its imports included."""
    try:
        from hisparse_plan.cli import main as command

        return command.main(argv)
    except KeyboardInterrupt:  # command.main catches its own: this is start-up's
        return interrupted()
