"""Every example in README.md and docs/*.md runs and prints what its page shows, or says why it
is not run (tests/support/doc_examples.py says how a block is marked)."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.doc_examples import (
    KINDS,
    NOT_EXAMPLES,
    PAGES,
    REPO,
    Block,
    all_blocks,
    blocks,
    check_json,
    in_checkout,
    normal,
    run_console,
    run_python,
    steps,
)

BLOCKS = all_blocks()
CONSOLE = [block for block in BLOCKS if block.runs and block.kind == "console"]
PYTHON_PAGES = sorted({block.page for block in BLOCKS if block.runs and block.kind == "python"})


@pytest.mark.parametrize("block", CONSOLE, ids=lambda block: block.name)
def test_console_example_prints_what_the_page_shows(block: Block) -> None:
    pytest.importorskip("rich")  # the pages show rich's tables
    if any("verify" in command for command, _ in steps(block)):
        pytest.importorskip("torch")
    if any("--plot" in command for command, _ in steps(block)):
        pytest.importorskip("matplotlib")
    for (command, shown), (_, printed) in zip(steps(block), run_console(block), strict=True):
        assert normal(printed, block.varies) == normal(shown, block.varies), command


@pytest.mark.parametrize("page", PYTHON_PAGES, ids=lambda page: page.name)
def test_python_examples_give_what_the_page_shows(page: Path) -> None:
    """A page's python blocks, in order, in one namespace; each shown result compared."""
    if any("hisparse_plan.torch" in line for block in blocks(page) for line in block.body):
        pytest.importorskip("torch")
    namespace: dict[str, object] = {}
    checked = 0
    with in_checkout():
        for block in blocks(page):
            if block.runs and block.kind == "python":
                for line, shown, now in run_python(block, namespace):
                    assert now == shown, f"{block.name}, line {line + 1}"
                    checked += 1
    assert checked > 0, f"{page.name}: its python examples show no result to compare"


def test_every_block_runs_or_says_why_not() -> None:
    """Each fenced block names its kind; a command or code block either runs (and is compared
    above) or is marked `no-run:` with a reason; shell blocks never run, so each says why."""
    for block in BLOCKS:
        assert block.kind in KINDS, f"{block.name}: kind {block.kind!r}, expected one of {KINDS}"
        assert "`" not in block.note, f"{block.name}: a backtick ends a fence's info string"
        if block.kind == "bash":
            assert block.not_run, (f"{block.name}: a bash block runs nowhere; show it as a "
                                   "console example with its output, or mark it no-run: REASON")
        if block.not_run is not None:
            assert len(block.not_run.split()) >= 3, f"{block.name}: say why it is not run"
        if block.kind in NOT_EXAMPLES:
            assert block.not_run is None, block.name
            assert not block.varies, block.name
        if block.kind == "console":
            assert steps(block), f"{block.name}: no `$ hisparse-plan` command"
        if block.kind == "json":
            check_json(block)


def test_examples_are_counted() -> None:
    """Most examples run, few are only shown, and every subcommand has a shown run."""
    run = [block for block in BLOCKS if block.runs]
    not_run = [block for block in BLOCKS if block.not_run is not None]
    assert len(run) >= 40, len(run)
    assert len(not_run) <= 11, [block.name for block in not_run]
    commands = " ".join(command for block in CONSOLE for command, _ in steps(block))
    for name in ("plan", "capacity", "tune", "explain", "schema", "models", "manifest", "diff",
                 "verify", "docs"):
        assert f"hisparse-plan {name} " in commands, name


def test_the_parser_sees_every_fence() -> None:
    """A fence the parser missed would be an example nobody runs: count them independently."""
    for page in PAGES:
        fences = [line for line in page.read_text(encoding="utf-8").splitlines()
                  if line.startswith("```")]
        assert len(fences) == 2 * len(blocks(page)), page.name


def test_a_changed_output_fails(tmp_path: Path) -> None:
    """The comparison is not vacuous: a console block and a python result that show something
    else than what runs are caught."""
    page = tmp_path / "page.md"
    page.write_text("```console\n$ hisparse-plan models | head -n 1\nsomething else\n```\n\n"
                    "```python\n1 + 1\n# 3\n```\n", encoding="utf-8")
    console, python = blocks(page)
    (_, shown), = steps(console)
    (_, printed), = run_console(console)
    assert normal(printed) != normal(shown)
    assert printed.startswith("sparse-MLA presets")
    (_, shown_result, now), = run_python(python, {})
    assert (shown_result, now) == ("3", "2")


def test_varying_lines_are_compared_by_their_label() -> None:
    shown = "  seconds      4.25\n  pages        1464\n"
    assert normal("  seconds      79.58\n  pages        1464", frozenset({"seconds"})) == \
        normal(shown, frozenset({"seconds"}))
    assert normal("  seconds  1\n  pages  1465", frozenset({"seconds"})) != \
        normal(shown, frozenset({"seconds"}))


def test_pages_are_the_readme_and_every_doc() -> None:
    assert PAGES[0] == REPO / "README.md"
    assert {page.name for page in PAGES[1:]} == {page.name for page in (REPO / "docs").glob("*.md")}
