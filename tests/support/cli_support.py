"""The type of the `cli` fixture (tests/conftest.py), for annotations."""

from __future__ import annotations

from collections.abc import Callable

Run = Callable[..., tuple[int, str, str]]
"""`cli(*argv)` -> (exit code, stdout, stderr): the command run in-process."""
