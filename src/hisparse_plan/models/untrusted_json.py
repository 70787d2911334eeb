"""Reading a JSON file anyone may have written: a model's config.json, a plan request, a plan,
a checkpoint's weight index. Every such file is read here, and nowhere else.

- Only a regular file is read. A directory, a device (a symlink to /dev/zero among them), a
  FIFO or a socket is refused before a byte of it is read: `stat` refuses it before it is
  opened, and `fstat` of the opened descriptor refuses one swapped in between, so what is
  read is what was checked. The open never waits: O_NONBLOCK keeps a FIFO from waiting for a
  writer, O_NOCTTY keeps a terminal from becoming this process's.
- At most `max_bytes` are read, and one more byte tells a file that grew past the bound.
- The bytes must be UTF-8, the encoding RFC 8259 requires of JSON exchanged between systems.
- A key named twice in one object, nesting deeper than `max_depth` and a top level that is
  not an object are refused (`models.json_input`, which requests read from text share).

Each refusal is one `PlanError` that starts with the file's label (its path, or the flag and
path the command line was given) and says what was expected and what was found.
"""

from __future__ import annotations

import os
import stat
from typing import Any, Final

from hisparse_plan.errors import PlanError
from hisparse_plan.models.json_input import MAX_DEPTH, load_json_object

MAX_JSON_BYTES: Final = 64 * 2**20
"""64 MiB, for requests, plans and weight indexes: a request for 100,000 distinct layers
(benchmarks/bench_scale.py) is 20 MiB indented, DeepSeek-V3's model.safetensors.index.json
about 9 MB."""
MAX_CONFIG_BYTES: Final = 4 * 2**20
"""4 MiB, for a model's config.json: the Hub's are under 100 KB, and this still holds a
per-layer list (`layer_types`) for the most layers a config may have (presets.layer_count)."""

PathLike = str | os.PathLike[str]
_KINDS: Final = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
)
_OPEN_FLAGS: Final = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def _refuse_unless_regular(info: os.stat_result, label: str, max_bytes: int) -> None:
    """A regular file of at most `max_bytes`, or a PlanError saying what it is."""
    if not stat.S_ISREG(info.st_mode):
        kind = next((name for test, name in _KINDS if test(info.st_mode)), "not a regular file")
        raise PlanError(f"{label}: {kind}; expected a regular file")
    if info.st_size > max_bytes:
        raise too_long(label, max_bytes, info.st_size)


def too_long(label: str, max_bytes: int, size: int | None) -> PlanError:
    """The refusal of input past `max_bytes` (`size` None: only known to be longer)."""
    got = "more than that" if size is None else f"{size} bytes"
    return PlanError(f"{label}: expected at most {max_bytes} bytes, got {got}")


def decode_utf8(data: bytes, label: str) -> str:
    """`data` as UTF-8 text, or a PlanError naming the first byte that is not."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise PlanError(
            f"{label}: byte {data[error.start]:#04x} at offset {error.start} is not UTF-8 "
            f"({error.reason}); expected JSON text in UTF-8"
        ) from None


def _unreadable(label: str, error: OSError | ValueError) -> PlanError:
    why = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
    return PlanError(f"{label}: {why}; expected a readable regular file")


def read_text_file(path: PathLike, *, label: str | None = None,
                   max_bytes: int = MAX_JSON_BYTES) -> str:
    """The text of the regular file `path`, at most `max_bytes` bytes of UTF-8. `label` names
    the file in refusals (default: the path)."""
    if not isinstance(path, str | os.PathLike):
        raise PlanError(f"{label or 'path'}: expected a file path (str or os.PathLike), got "
                        f"{type(path).__name__}")
    label = label or os.fspath(path)
    try:
        info = os.stat(path)
    except (OSError, ValueError) as error:  # ValueError: a NUL byte in the path
        raise _unreadable(label, error) from None
    # Refused before it is opened: opening a device can have effects of its own.
    _refuse_unless_regular(info, label, max_bytes)
    try:
        descriptor = os.open(path, _OPEN_FLAGS)
    except OSError as error:
        raise _unreadable(label, error) from None
    try:
        _refuse_unless_regular(os.fstat(descriptor), label, max_bytes)
    except BaseException:
        os.close(descriptor)
        raise
    try:
        with os.fdopen(descriptor, "rb") as file:
            data = file.read(max_bytes + 1)  # the file may have grown since fstat
    except OSError as error:
        raise _unreadable(label, error) from None
    if len(data) > max_bytes:
        raise too_long(label, max_bytes, None)
    return decode_utf8(data, label)


def parse_json_text(text: str, *, what: str, label: str, max_depth: int = MAX_DEPTH
                    ) -> dict[str, Any]:
    """The JSON object in `text` read from the file `label` names, parsed strictly: `what` it
    holds ("config", "plan") names it in refusals about its content."""
    try:
        return load_json_object(text, what=what, max_depth=max_depth)
    except PlanError as error:
        raise PlanError(f"{label}: {error}", field=error.field) from None


def read_json_file(path: PathLike, *, what: str, label: str | None = None,
                   max_bytes: int = MAX_JSON_BYTES, max_depth: int = MAX_DEPTH
                   ) -> dict[str, Any]:
    """The JSON object in the regular file `path`: `read_text_file`, then `parse_json_text`."""
    text = read_text_file(path, label=label, max_bytes=max_bytes)
    return parse_json_text(text, what=what, label=label or os.fspath(path), max_depth=max_depth)
