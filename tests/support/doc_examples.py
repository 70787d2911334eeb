"""The fenced blocks of README.md and docs/*.md, and what running them prints.

Every block names its kind on its opening fence:

- `console`: `$ hisparse-plan ...` commands, each followed by what it prints. A command may end
  in `> FILE` (its stdout saved for a later command of the block), `| head -n N`, or
  `; echo "exit $?"` (its exit code shown as the last line). Run in-process, in a scratch
  folder where `tests/` and `src/` lead to the checkout's.
- `python`: run in order, one namespace per page, from the checkout's root. A comment line
  right after a top-level expression statement is the `repr` of its value.
- `bash`, `console` or `python` with `no-run: REASON` after the kind: shown, not run, for the
  reason given (an install, a GPU, an engine that may not be installed).
- `console varies: WORD, WORD`: lines that start with one of the words (timings) are compared
  by that word only.
- `text` (a formula, a diagram) and `json` (a document, which must parse): not examples.

`python tests/support/doc_examples.py --write` runs every example and writes what it printed back
into
the pages: after a change that moves a figure, run it and read the diff.
"""

from __future__ import annotations

import ast
import contextlib
import io
import itertools
import json
import os
import re
import shlex
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from support import paths

REPO = paths.REPO
PAGES = (REPO / "README.md", *sorted((REPO / "docs").glob("*.md")))
RUN = frozenset({"console", "python"})
NOT_EXAMPLES = frozenset({"text", "json"})
KINDS = RUN | NOT_EXAMPLES | {"bash"}
NO_RUN = "no-run:"
VARIES = "varies:"
FENCE = "```"
EXIT = re.compile(r';\s*echo "exit \$\?"$')
HEAD = re.compile(r"\s*\|\s*head -n (\d+)$")
SAVE = re.compile(r"\s*>\s*(\S+)$")
PLOTS = ("--plot", "--plot-memory")
LINKED = ("tests", "src")
"""Folders of the checkout a console example may read (golden requests, config files)."""


@dataclass(frozen=True)
class Block:
    """One fenced block: its page, the line of its opening fence (1-based), its kind, what
    follows the kind on the fence, and the lines between the fences."""

    page: Path
    line: int
    kind: str
    note: str
    body: tuple[str, ...]

    @property
    def name(self) -> str:
        page = self.page.relative_to(REPO) if self.page.is_relative_to(REPO) else self.page
        return f"{page}:{self.line}"

    @property
    def not_run(self) -> str | None:
        """Why the block is not run (None: it runs, or it is no example)."""
        if self.note.startswith(NO_RUN):
            return self.note.removeprefix(NO_RUN).strip()
        return None

    @property
    def runs(self) -> bool:
        return self.kind in RUN and self.not_run is None

    @property
    def varies(self) -> frozenset[str]:
        if not self.note.startswith(VARIES):
            return frozenset()
        return frozenset(word.strip() for word in self.note.removeprefix(VARIES).split(","))


def blocks(page: Path) -> list[Block]:
    """The page's fenced blocks; an opening fence without a closing one is an error."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    opened: tuple[int, str, str] | None = None
    body: list[str] = []
    for number, line in enumerate(lines, 1):
        if opened is None:
            if line.startswith(FENCE):
                kind, _, note = line[len(FENCE):].strip().partition(" ")
                opened, body = (number, kind, note.strip()), []
        elif line == FENCE:
            found.append(Block(page, opened[0], opened[1], opened[2], tuple(body)))
            opened = None
        else:
            body.append(line)
    if opened is not None:
        raise ValueError(f"{page}:{opened[0]}: a fence that is never closed")
    return found


def all_blocks() -> list[Block]:
    return [block for page in PAGES for block in blocks(page)]


# ---- console -------------------------------------------------------------------------------

Step = tuple[str, str]
"""A command (without `$ `) and what the page shows it print."""


def steps(block: Block) -> list[Step]:
    found: list[Step] = []
    for chunk in re.split(r"^(?=\$ )", "\n".join(block.body), flags=re.MULTILINE):
        if not chunk:
            continue
        command, _, output = chunk.partition("\n")
        if not command.startswith("$ hisparse-plan "):
            raise ValueError(f"{block.name}: {command[:60]!r} is no `$ hisparse-plan` command; "
                             "mark the block no-run with a reason")
        found.append((command.removeprefix("$ "), output))
    return found


def run_command(command: str) -> str:
    """What a terminal shows for one command, run in-process in the current folder."""
    from hisparse_plan.cli.main import main

    shown_exit = EXIT.search(command)
    command = EXIT.sub("", command)
    head = HEAD.search(command)
    command = HEAD.sub("", command)
    save = SAVE.search(command)
    command = SAVE.sub("", command)
    argv = shlex.split(command)[1:]
    for flag, value in itertools.pairwise(argv):
        if flag in PLOTS:
            Path(value).parent.mkdir(parents=True, exist_ok=True)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    printed = out.getvalue()
    if save:
        Path(save.group(1)).write_text(printed, encoding="utf-8")
        printed = ""
    # A terminal shows stderr first: the commands print it before their output.
    lines = (err.getvalue() + printed).splitlines()
    if head:
        lines = lines[: int(head.group(1))]
    if shown_exit:
        lines.append(f"exit {code}")
    elif code != 0:
        raise AssertionError(f"{command}: exit {code}: {err.getvalue()}")
    return "\n".join(lines)


@contextlib.contextmanager
def scratch_folder() -> Iterator[Path]:
    """A scratch working folder where the checkout's tests/ and src/ can be read."""
    before = Path.cwd()
    with tempfile.TemporaryDirectory() as folder:
        for name in LINKED:
            (Path(folder) / name).symlink_to(REPO / name)
        os.chdir(folder)
        try:
            yield Path(folder)
        finally:
            os.chdir(before)


def normal(text: str, varies: frozenset[str] = frozenset()) -> list[str]:
    """Lines as compared: trailing spaces and blank lines dropped; a varying line by its first
    word."""
    lines = [line.rstrip() for line in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return [line.split()[0] if line.split() and line.split()[0] in varies else line
            for line in lines]


def run_console(block: Block) -> list[Step]:
    """Each command of the block and what it prints now."""
    with scratch_folder():
        return [(command, run_command(command)) for command, _ in steps(block)]


# ---- python --------------------------------------------------------------------------------

Result = tuple[int, str, str]
"""A shown result: its line in the block (0-based), what the page shows, the repr now."""


def run_python(block: Block, namespace: dict[str, object]) -> list[Result]:
    """Run the block in `namespace`; each shown result beside what the expression gives."""
    results: list[Result] = []
    tree = ast.parse("\n".join(block.body), filename=block.name)
    for statement in tree.body:
        end = statement.end_lineno or statement.lineno
        shown = block.body[end] if end < len(block.body) else ""
        if isinstance(statement, ast.Expr) and shown.startswith("# "):
            code = compile(ast.Expression(statement.value), block.name, "eval")
            results.append((end, shown[2:], repr(eval(code, namespace))))
        else:
            exec(compile(ast.Module([statement], []), block.name, "exec"), namespace)
    return results


@contextlib.contextmanager
def in_checkout() -> Iterator[None]:
    before = Path.cwd()
    os.chdir(REPO)
    try:
        yield
    finally:
        os.chdir(before)


def check_json(block: Block) -> None:
    json.loads("\n".join(block.body))


# ---- --write -------------------------------------------------------------------------------


def refreshed(block: Block, namespace: dict[str, object]) -> list[str]:
    """The block's lines with what its examples print now."""
    if block.kind == "console":
        lines: list[str] = []
        for command, printed in run_console(block):
            lines += [f"$ {command}", *printed.splitlines()]
        return lines
    body = list(block.body)
    with in_checkout():
        for line, _, now in run_python(block, namespace):
            body[line] = f"# {now}"
    return body


def write(page: Path) -> bool:
    """Rewrite the page's runnable blocks with what they print now; whether anything moved."""
    before = page.read_text(encoding="utf-8")
    lines = before.splitlines()
    namespace: dict[str, object] = {}
    runnable = [block for block in blocks(page) if block.runs]
    bodies = [refreshed(block, namespace) for block in runnable]  # python: in page order
    for block, body in reversed(list(zip(runnable, bodies, strict=True))):
        lines[block.line:block.line + len(block.body)] = body
    text = "\n".join(lines) + "\n"
    page.write_text(text, encoding="utf-8")
    return text != before


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/support/doc_examples.py --write")
    for page in PAGES:
        if write(page):
            print(f"updated {page.relative_to(REPO)}")
