"""The files an operator names on the command line, read as every untrusted file is
(`hisparse_plan.models.untrusted_json`: a regular file of bounded size, UTF-8), each refusal naming
the flag and the path.

Standard input ('-') is read too, but never more than the cap plus one byte, which is enough
to tell that it was too long.
"""

from __future__ import annotations

import sys
from typing import Final

from hisparse_plan.cli.errors import CommandError
from hisparse_plan.models.untrusted_json import (
    MAX_JSON_BYTES,
    decode_utf8,
    read_text_file,
    too_long,
)

MAX_INPUT_BYTES: Final = MAX_JSON_BYTES
"""The most bytes of a request or plan the command line reads (64 MiB)."""


def read_input(path: str, flag: str) -> str:
    """The text of `path` ('-' for standard input), at most MAX_INPUT_BYTES bytes of UTF-8."""
    if path != "-":
        return read_text_file(path, label=f"{flag} {path}", max_bytes=MAX_INPUT_BYTES)
    if sys.stdin is None:  # descriptor 0 was closed (`<&-`)
        raise CommandError(f"{flag} -: standard input is closed; expected the file there")
    label = f"{flag} - (standard input)"
    data = sys.stdin.buffer.read(MAX_INPUT_BYTES + 1)
    if len(data) > MAX_INPUT_BYTES:
        raise too_long(label, MAX_INPUT_BYTES, None)
    return decode_utf8(data, label)


def config_label(path: str) -> str:
    """How refusals of a `--hf-config` file name it."""
    return f"--hf-config {path}"
