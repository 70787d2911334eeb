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
from typing import Final, Protocol

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


@contextmanager
def _rich_display() -> Iterator[Display]:
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TaskID,
        TextColumn,
        TimeElapsedColumn,
    )

    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), console=Console(file=sys.stderr), transient=True,
    ) as bar:
        tasks: dict[str, TaskID] = {}

        class RichDisplay:
            def update(self, step: str, done: int, total: int) -> None:
                if step not in tasks:
                    tasks[step] = bar.add_task(step, total=total)
                bar.update(tasks[step], completed=done, total=total)

        yield RichDisplay()


@contextmanager
def progress_reporter(*, quiet: bool) -> Iterator[Progress | None]:
    """The callback to hand the backend, or None when nothing should be drawn."""
    if quiet or not sys.stderr.isatty():
        yield None
        return
    if rich_available():
        with _rich_display() as display:
            yield StepProgress(display)
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
