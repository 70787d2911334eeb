"""Ctrl-C at any moment of the command, start-up imports included: one line on stderr and exit
code 130, never a traceback. Each case runs the command in a child process, stops it inside
one import (a finder that signals, then sleeps, when that module is first looked for) and
sends it SIGINT there."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from support import paths

ROOT = paths.REPO
HOLD = """
import importlib.abc, os, sys, time

class Hold(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == os.environ["HOLD_MODULE"]:
            open(os.environ["HOLD_MARK"], "w").close()
            time.sleep(120)
        return None

sys.meta_path.insert(0, Hold())
"""
"""Prepended to the child's code: it stops in the import of HOLD_MODULE."""
WAIT_S = 120.0
"""A safety net for a child that never reaches the import (not a pass/fail figure)."""


def _console_script() -> str:
    """What pip's wrapper for `hisparse-plan` runs: import the entry point, call it."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, function = scripts["hisparse-plan"].split(":")
    return f"import sys\nfrom {module} import {function}\nsys.exit({function}())\n"


RUN_MODULE = "import runpy\nrunpy.run_module('hisparse_plan.cli', run_name='__main__')\n"
"""`python -m hisparse_plan.cli`."""


def _interrupted_in(module: str, code: str, argv: list[str], tmp_path: Path) -> None:
    mark = tmp_path / "held"
    env = {**os.environ, "HOLD_MODULE": module, "HOLD_MARK": str(mark)}
    child = subprocess.Popen(
        [sys.executable, "-c", HOLD + code, *argv], env=env, cwd=tmp_path,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + WAIT_S
        while not mark.exists() and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert mark.exists(), f"the command never imported {module}"
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=WAIT_S)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert (child.returncode, out, err) == (130, "", "error: interrupted\n")


@pytest.mark.parametrize("module", [
    "hisparse_plan.cli.main",  # the command's own module, imported first
    "pydantic",  # the first dependency
    "hisparse_plan.targets.vllm",  # deep in the command's imports
])
def test_ctrl_c_while_the_command_starts_is_one_line_and_130(
    tmp_path: Path, module: str
) -> None:
    _interrupted_in(module, _console_script(), ["models", "--json"], tmp_path)


def test_ctrl_c_while_python_m_starts_is_one_line_and_130(tmp_path: Path) -> None:
    _interrupted_in("hisparse_plan.cli.main", RUN_MODULE, ["models", "--json"], tmp_path)


def test_ctrl_c_while_the_command_prints_is_one_line_and_130(tmp_path: Path) -> None:
    """rich is imported only to print a table, after the plan is made."""
    pytest.importorskip("rich")
    _interrupted_in("rich", _console_script(), ["plan", "llama-3-8b"], tmp_path)


def test_the_command_imports_nothing_heavy_before_its_guard() -> None:
    """The entry point's module, with its packages, imports no dependency and no model: an
    eager import in `hisparse_plan/__init__.py` would run before the guard."""
    module = _console_script().splitlines()[1].split()[1]
    code = (f"import sys\nimport {module}\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('pydantic', 'rich', 'torch') or m.startswith('hisparse_plan.')))")
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True).stdout
    assert shown == str(["hisparse_plan.cli", "hisparse_plan.cli.launch",
                         "hisparse_plan.cli.stderr"]) + "\n"
