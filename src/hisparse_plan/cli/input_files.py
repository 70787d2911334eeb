"""Reading the files an operator names, quickly refused when they cannot be a request.

A request is a regular file of at most `MAX_INPUT_BYTES`. Anything else (a device such as
/dev/zero, a FIFO, a directory) is refused at once, before a single byte is read: reading it
could block or never end. Standard input is read too, but never more than the cap plus one
byte, which is enough to tell that it was too long.
"""

from __future__ import annotations

import os
import stat
import sys
from typing import Final

from hisparse_plan.cli.errors import CommandError
from hisparse_plan.cli.sizes import format_size

MAX_INPUT_BYTES: Final = 64 * 2**20
"""64 MiB: a request for 100,000 layers is a few MiB."""

_KINDS: Final = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
)


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _too_long(what: str, size: int | None) -> CommandError:
    got = "more than that" if size is None else f"{size} bytes"
    return CommandError(
        f"{what}: expected at most {MAX_INPUT_BYTES} bytes ({format_size(MAX_INPUT_BYTES)}), "
        f"got {got}"
    )


def _check(info: os.stat_result, path: str, flag: str) -> None:
    if not stat.S_ISREG(info.st_mode):
        raise CommandError(f"{flag} {path}: {_kind(info.st_mode)}; expected a regular file")
    if info.st_size > MAX_INPUT_BYTES:
        raise _too_long(f"{flag} {path}", info.st_size)


def check_regular_file(path: str, flag: str) -> None:
    """Refuse, without opening it, a path that is not a regular file within the cap (OSError
    when it does not exist). For readers that open the path themselves."""
    _check(os.stat(path), path, flag)


def read_input(path: str, flag: str) -> bytes:
    """The bytes of `path` ('-' for standard input), at most MAX_INPUT_BYTES of them."""
    if path == "-":
        if sys.stdin is None:  # descriptor 0 was closed (`<&-`)
            raise CommandError(f"{flag} -: standard input is closed; expected the file there")
        data = sys.stdin.buffer.read(MAX_INPUT_BYTES + 1)
        if len(data) > MAX_INPUT_BYTES:
            raise _too_long(f"{flag} - (standard input)", None)
        return data
    # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer. It has no
    # effect on the regular file that is read afterwards.
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        _check(os.fstat(descriptor), path, flag)
    except BaseException:
        os.close(descriptor)
        raise
    with os.fdopen(descriptor, "rb") as file:
        data = file.read(MAX_INPUT_BYTES + 1)  # the file may have grown since fstat
    if len(data) > MAX_INPUT_BYTES:
        raise _too_long(f"{flag} {path}", None)
    return data
