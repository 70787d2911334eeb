"""Text from input (layer names, file names) made safe for a terminal.

A layer name is whatever the request file says: it may hold escape sequences that clear the
screen or retitle the window, a carriage return that overwrites the line, a newline that forges
an `error:` line, or a right-to-left override. Every character that is not printable is shown
the way Python's repr shows it (`\\x1b`, `\\n`, `\\u202e`), so what the terminal shows is
what the file holds.
"""

from __future__ import annotations


def printable(text: str) -> str:
    """`text` with every non-printable character escaped as repr escapes it."""
    if text.isprintable():  # the common case, decided without a Python loop
        return text
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)
