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
# Timings differ run to run, and --plot would rewrite the README's image.
UNSTABLE = ("verify", "--plot")


def examples() -> list[tuple[str, str]]:
    text = README.read_text(encoding="utf-8")
    section = text[text.index(MARKER):] if MARKER in text else ""
    found = []
    for block in re.findall(r"```console\n(.*?)```", section, flags=re.DOTALL):
        command, _, output = block.partition("\n")
        if command.startswith("$ hisparse-plan ") and not any(w in command for w in UNSTABLE):
            found.append((command.removeprefix("$ "), output))
    return found


@pytest.mark.parametrize(("command", "expected"), examples())
def test_readme_example(
    command: str, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("rich")  # the README shows rich's tables
    shown_exit = EXIT.search(command)
    command = EXIT.sub("", command)
    head = HEAD.search(command)
    command = HEAD.sub("", command)
    code = main(shlex.split(command)[1:])
    out, err = capsys.readouterr()
    # A terminal shows stderr first: it is unbuffered, and the commands print it before output.
    lines = (err + out).splitlines()
    if head:
        lines = lines[: int(head.group(1))]
    if shown_exit:
        lines.append(f"exit {code}")
    else:
        assert code == 0
    assert "\n".join(lines).rstrip() == expected.rstrip()


def test_readme_has_examples() -> None:
    commands = " ".join(command for command, _ in examples())
    for name in ("plan", "capacity", "tune", "explain", "schema", "models"):
        assert re.search(rf"hisparse-plan {name}\b", commands), name
