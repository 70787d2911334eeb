"""The README leads: short, the two commands first, a tour of the command and the library,
and a link to every page of docs/. Its examples (and the docs') run in
tests/project/test_doc_examples.py."""

from __future__ import annotations

import re

from hisparse_plan.cli.main import COMMANDS
from hisparse_plan.rule_docs import DOC_NAMES
from support import paths
from support.doc_examples import blocks

REPO = paths.REPO
README = REPO / "README.md"
TEXT = README.read_text(encoding="utf-8")
MAX_LINES = 250


def test_readme_is_short() -> None:
    assert len(TEXT.splitlines()) <= MAX_LINES


def test_readme_links_every_doc() -> None:
    linked = set(re.findall(r"\]\(docs/([\w-]+)\.md", TEXT))
    assert linked == set(DOC_NAMES)


def test_readme_tours_every_command() -> None:
    """The command table names each subcommand, in a backticked cell."""
    table = [line for line in TEXT.splitlines() if line.startswith("| `")]
    cells = " ".join(table)
    for command in COMMANDS:
        assert re.search(rf"`{command.name}\b", cells), command.name


def test_readme_tours_the_library() -> None:
    code = "\n".join("\n".join(block.body) for block in blocks(README)
                     if block.kind == "python" and block.runs)
    for call in ("hp.plan(", "hp.plan_for_engine(", "hp.check_plan(", "hp.load_plan(",
                 "plan_views(", "allocate(", "verify(", "meta_check(", "pool_kwargs("):
        assert call in code, call


def test_readme_says_what_it_is_before_the_details() -> None:
    """Regular models and HiSparse, vLLM and SGLang, in the first screen after the commands."""
    head = TEXT[: TEXT.index("## The command line")]
    for words in ("regular models", "HiSparse", "vLLM", "SGLang", "torch", "placeholder"):
        assert words in head, words
