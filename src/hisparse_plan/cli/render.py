"""Human output: tables drawn with rich when it is installed (the `cli` extra), plain aligned
text otherwise or with --plain. Machine output is `--json`, never this."""

from __future__ import annotations

import argparse
import importlib.util
import io
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from hisparse_plan.cli.printable import printable

Align = Literal["left", "right"]


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    align: Align = "left"


def rich_available() -> bool:
    return importlib.util.find_spec("rich") is not None


def concurrency(value: float | None) -> str:
    """Concurrency figures to two decimals: requests are whole, the second decimal shows trends."""
    return "-" if value is None else f"{value:.2f}"


class Renderer:
    """Writes headings, lines and tables to stdout; every piece of text goes through
    `printable`, since layer names come from input."""

    def __init__(self, *, plain: bool = False) -> None:
        self._rich = not plain and rich_available()

    def heading(self, text: str) -> None:
        text = printable(text)
        if self._rich:
            from rich.text import Text

            _rich_print(Text(text, style="bold"))
        else:
            print(text)

    def line(self, text: str = "") -> None:
        print(printable(text))

    def table(
        self, columns: Sequence[Column], rows: Sequence[Sequence[str]], title: str | None = None
    ) -> None:
        columns = [Column(printable(column.name), column.align) for column in columns]
        rows = [[printable(cell) for cell in row] for row in rows]
        title = None if title is None else printable(title)
        if self._rich:
            self._rich_table(columns, rows, title)
        else:
            self._plain_table(columns, rows, title)

    def pairs(self, rows: Sequence[tuple[str, str]], title: str | None = None) -> None:
        """Labelled values, one per line."""
        if title:
            self.heading(title)
        rows = [(printable(label), printable(value)) for label, value in rows]
        width = max((len(label) for label, _ in rows), default=0)
        for label, value in rows:
            print(f"  {label.ljust(width)}  {value}".rstrip())

    def _rich_table(
        self, columns: Sequence[Column], rows: Sequence[Sequence[str]], title: str | None
    ) -> None:
        from rich import box
        from rich.table import Table
        from rich.text import Text

        if title:
            # A heading, not the table's title, which rich would wrap to the table's width.
            self.heading(title)
        table = Table(box=box.SIMPLE_HEAD, show_edge=False)
        for column in columns:
            table.add_column(column.name, justify=column.align, overflow="fold")
        for row in rows:
            # Text, not markup: layer names and formulas hold brackets rich would parse.
            table.add_row(*(Text(cell) for cell in row))
        _rich_print(table)
        print()

    @staticmethod
    def _plain_table(
        columns: Sequence[Column], rows: Sequence[Sequence[str]], title: str | None
    ) -> None:
        if title:
            print(title)
        widths = [
            max([len(column.name), *(len(row[i]) for row in rows)])
            for i, column in enumerate(columns)
        ]

        def cells(values: Sequence[str]) -> str:
            parts = [
                value.rjust(width) if column.align == "right" else value.ljust(width)
                for value, width, column in zip(values, widths, columns, strict=True)
            ]
            return "  ".join(parts).rstrip()

        print(cells([column.name for column in columns]))
        print("  ".join("-" * width for width in widths))
        for row in rows:
            print(cells(row))
        print()


def _rich_print(renderable: object) -> None:
    """Styled on a terminal; elsewhere (pipes, files, captured output) plain, and without the
    trailing blanks rich pads table lines with."""
    from rich.console import Console

    if sys.stdout.isatty():
        Console(file=sys.stdout, highlight=False).print(renderable)
        return
    buffer = io.StringIO()
    Console(file=buffer, highlight=False, color_system=None, width=100).print(renderable)
    for line in buffer.getvalue().splitlines():
        print(line.rstrip())


def add_output_arguments(parser: argparse.ArgumentParser) -> None:
    """--json and --plain: every command that prints a result takes them."""
    parser.add_argument("--json", action="store_true", help="print JSON for machines")
    parser.add_argument("--plain", action="store_true",
                        help="plain text tables, even when rich is installed")
