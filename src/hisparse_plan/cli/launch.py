"""The `hisparse-plan` command's first code. It imports nothing heavy itself: every command,
model and dependency is imported inside `main`'s Ctrl-C guard, so that an interrupt at any
moment, start-up included, is one line on stderr and exit code 130, never a traceback."""

from __future__ import annotations

from collections.abc import Sequence

from hisparse_plan.cli.stderr import interrupted


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command (`hisparse_plan.cli.main.main`), its imports included."""
    try:
        from hisparse_plan.cli import main as command

        return command.main(argv)
    except KeyboardInterrupt:  # command.main catches its own: this is start-up's
        return interrupted()
