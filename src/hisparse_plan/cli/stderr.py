"""What the command says on stderr: one line, never more (and nothing when stderr is closed);
Ctrl-C's line and exit code. Imports nothing heavy: `launch` says it before the command is
imported."""

from __future__ import annotations

import contextlib
import sys
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
