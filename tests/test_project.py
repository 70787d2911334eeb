"""The project keeps its promises: pure core, typed package, README commands that CI runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
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
    """Each expression line followed by a `# result` line in the first python block evaluates
    to exactly that result."""
    text = (REPO / "README.md").read_text()
    block = text.split("```python\n", 1)[1].split("```", 1)[0].splitlines()
    namespace: dict[str, object] = {}
    checked = 0
    for line, following in zip(block, [*block[1:], ""], strict=True):
        if not line or line.startswith("#"):
            continue
        if following.startswith("# "):
            assert repr(eval(line, namespace)) == following[2:], line
            checked += 1
        else:
            exec(line, namespace)
    assert checked == 3
