"""The project keeps its promises: pure core, typed package, README commands that CI runs."""

from __future__ import annotations

import subprocess
import sys
import tomllib

import pytest

from support import paths
from support.doc_examples import blocks

REPO = paths.REPO
SRC = REPO / "src" / "hisparse_plan"


def _readme_commands() -> list[str]:
    lines = (REPO / "README.md").read_text().splitlines()
    blocks = [i for i, line in enumerate(lines) if line.startswith("```")]
    return [lines[blocks[0] + 1], lines[blocks[2] + 1]]


def test_readme_opens_with_two_commands_and_ci_runs_the_second() -> None:
    setup_and_plan, setup_and_test = _readme_commands()
    assert "hisparse-plan plan" in setup_and_plan
    assert "pytest" in setup_and_test
    ci = (REPO / ".ci" / "run").read_text()
    assert setup_and_test in ci.splitlines()


def test_core_never_imports_torch() -> None:
    code = (
        "import sys, hisparse_plan, hisparse_plan.checking, hisparse_plan.views, "
        "hisparse_plan.cli.main, hisparse_plan.adapters.vllm.meta_model; "
        "print('torch' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert result.stdout.strip() == "False"


def test_torch_is_named_only_in_the_backend() -> None:
    for path in SRC.rglob("*.py"):
        if "torch" in path.relative_to(SRC).parts[:1]:
            continue
        for line in path.read_text().splitlines():
            stripped = line.strip()
            assert not stripped.startswith(("import torch", "from torch")), path


def test_no_assert_validates_input_in_the_library() -> None:
    for path in SRC.rglob("*.py"):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            assert not line.lstrip().startswith("assert "), f"{path}:{number}"


def test_package_is_typed() -> None:
    assert (SRC / "py.typed").is_file()


def test_readme_library_example_shows_real_output() -> None:
    """The README's library tour shows results (tests/project/test_doc_examples.py compares each
    with
    what it gives now)."""
    results = [line for block in blocks(REPO / "README.md") if block.kind == "python"
               for line in block.body if line.startswith("# ")]
    assert len(results) >= 5


def test_description_and_help_say_what_it_is(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both engines and both kinds of model, in the package description and in `--help`."""
    from hisparse_plan.cli.main import main

    monkeypatch.setenv("COLUMNS", "400")  # argparse wraps at the terminal's width

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert main(["--help"]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    for text in (project["description"], shown):
        for words in ("vLLM", "SGLang", "regular models", "HiSparse"):
            assert words in text, words
    assert "a HiSparse sparse-MLA KV cache" not in project["description"] + shown
    assert "hisparse-plan docs --list" in shown
