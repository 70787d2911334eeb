"""Progress for the long steps of allocating and verifying pools, on stderr.

The torch backend reports `progress(step, done, total)` ("prefault", "register", "verify"; an
older backend calls `progress(done, total)` for verify alone). A step shows up only once it has
run for SHOW_AFTER_S seconds, so quick runs print nothing; on a terminal it is a rich bar when
rich is installed, a counting line otherwise; off a terminal, or with --quiet, nothing at all.
Library code never prints: only this module, in the CLI, draws.
"""

from __future__ import annotations

import inspect
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Final, Protocol

from hisparse_plan.cli.render import rich_available

SHOW_AFTER_S: Final = 1.0
"""A step that finishes sooner is never drawn."""
Progress = Callable[..., None]
"""What the backend calls: progress(step, done, total), or progress(done, total)."""


class Display(Protocol):
    def update(self, step: str, done: int, total: int) -> None: ...


class StepProgress:
    """The callback handed to the backend: tracks when each step started and draws it on
    `display` once it has run SHOW_AFTER_S seconds."""

    def __init__(self, display: Display, *, default_step: str = "verify",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._display = display
        self._default_step = default_step
        self._clock = clock
        self._started: dict[str, float] = {}
        self._shown: set[str] = set()

    def __call__(self, *args: object) -> None:
        if len(args) == 3 and isinstance(args[1], int) and isinstance(args[2], int):
            step, done, total = str(args[0]), args[1], args[2]
        elif len(args) == 2 and isinstance(args[0], int) and isinstance(args[1], int):
            step, done, total = self._default_step, args[0], args[1]
        else:
            return  # a call this version does not know: progress is never worth a failure
        now = self._clock()
        started = self._started.setdefault(step, now)
        if step not in self._shown:
            if now - started < SHOW_AFTER_S:
                return  # quick so far (a step that ends this soon is never drawn)
            self._shown.add(step)
        self._display.update(step, done, total)


class LineDisplay:
    """`\\rstep: done/total` on one line per step, for a terminal without rich."""

    def update(self, step: str, done: int, total: int) -> None:
        sys.stderr.write(f"\r{step}: {done}/{total}")
        if done >= total:
            sys.stderr.write("\n")
        sys.stderr.flush()


class RichDisplay:
    """A rich bar per step on stderr, started at the first step worth drawing: a run whose
    steps are all quick (or refused at once) writes not a single byte, not even a cursor
    code."""

    def __init__(self) -> None:
        self._bar: Any = None
        self._tasks: dict[str, Any] = {}

    def update(self, step: str, done: int, total: int) -> None:
        if self._bar is None:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self._bar = Progress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                TimeElapsedColumn(), console=Console(file=sys.stderr), transient=True,
            )
            self._bar.start()
        if step not in self._tasks:
            self._tasks[step] = self._bar.add_task(step, total=total)
        self._bar.update(self._tasks[step], completed=done, total=total)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


@contextmanager
def progress_reporter(*, quiet: bool) -> Iterator[Progress | None]:
    """The callback to hand the backend, or None when nothing should be drawn."""
    if quiet or not sys.stderr.isatty():
        yield None
        return
    if rich_available():
        display = RichDisplay()
        try:
            yield StepProgress(display)
        finally:
            display.close()
        return
    yield StepProgress(LineDisplay())


def accepts_progress(function: Callable[..., object]) -> bool:
    """Whether `function` takes a `progress` keyword (backends before and after it had one)."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(
        p.name == "progress" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters
    )
