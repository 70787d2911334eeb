"""The README's command-line examples show what the commands print today."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from hisparse_plan.cli.main import main

README = Path(__file__).resolve().parent.parent / "README.md"
MARKER = "<!-- cli: maintained with the operator tools -->"
EXIT = re.compile(r';\s*echo "exit \$\?"$')
HEAD = re.compile(r"\s*\|\s*head -n (\d+)$")
SAVE = re.compile(r"\s*>\s*(\S+)$")
# Timings differ run to run, and --plot would rewrite the README's image.
UNSTABLE = ("verify", "--plot")
Step = tuple[str, str]
"""A command (without `$ `) and what it prints."""


def examples() -> list[list[Step]]:
    """Each console block: one or more `$ hisparse-plan ...` commands, each followed by its
    output. A command may end in `> FILE` (its stdout saved for a later command)."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index(MARKER):] if MARKER in text else ""
    found = []
    for block in re.findall(r"```console\n(.*?)```", section, flags=re.DOTALL):
        steps: list[Step] = []
        for chunk in re.split(r"^(?=\$ )", block, flags=re.MULTILINE):
            if chunk:
                command, _, output = chunk.partition("\n")
                steps.append((command, output))
        if all(command.startswith("$ hisparse-plan ") for command, _ in steps) and not any(
            word in command for command, _ in steps for word in UNSTABLE
        ):
            found.append([(command.removeprefix("$ "), output) for command, output in steps])
    return found


def _run(command: str, capsys: pytest.CaptureFixture[str]) -> str:
    """What a terminal shows for one command (files it saves land in the current folder)."""
    shown_exit = EXIT.search(command)
    command = EXIT.sub("", command)
    head = HEAD.search(command)
    command = HEAD.sub("", command)
    save = SAVE.search(command)
    command = SAVE.sub("", command)
    code = main(shlex.split(command)[1:])
    out, err = capsys.readouterr()
    if save:
        Path(save.group(1)).write_text(out)
        out = ""
    # A terminal shows stderr first: it is unbuffered, and the commands print it before output.
    lines = (err + out).splitlines()
    if head:
        lines = lines[: int(head.group(1))]
    if shown_exit:
        lines.append(f"exit {code}")
    else:
        assert code == 0, err
    return "\n".join(lines).rstrip()


@pytest.mark.parametrize("steps", examples(), ids=lambda steps: steps[0][0])
def test_readme_example(
    steps: list[Step], capsys: pytest.CaptureFixture[str], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("rich")  # the README shows rich's tables
    monkeypatch.chdir(tmp_path)
    for command, expected in steps:
        assert _run(command, capsys) == expected.rstrip(), command


def test_readme_has_examples() -> None:
    commands = " ".join(command for steps in examples() for command, _ in steps)
    for name in ("plan", "capacity", "tune", "explain", "schema", "models", "manifest", "diff"):
        assert re.search(rf"hisparse-plan {name}\b", commands), name
