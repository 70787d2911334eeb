"""`hisparse-plan docs`: the pages of docs/ (the planning rules and the plan contract that
error messages cite, and the guides), printed from the installed package."""

from __future__ import annotations

import argparse
from pathlib import Path

from hisparse_plan.cli.command import Command
from hisparse_plan.rule_docs import DOC_NAMES, doc_path


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", nargs="?", choices=DOC_NAMES, default="planning-rules",
                        help="which page (default planning-rules); a message's "
                             "docs/planning-rules.md#admission is `docs planning-rules`, "
                             "section Admission")
    parser.add_argument("--path", action="store_true",
                        help="print where the file is instead of its text")
    parser.add_argument("--list", action="store_true",
                        help="list every page with its title")


def title(path: Path) -> str:
    """A page's first heading."""
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("# "):
            return line.removeprefix("# ").strip()
    return ""


def run(args: argparse.Namespace) -> int:
    if args.list:
        width = max(len(name) for name in DOC_NAMES)
        for name in DOC_NAMES:
            print(f"{name.ljust(width)}  {title(doc_path(name))}")
        return 0
    path = doc_path(args.name)
    print(path if args.path else path.read_text(encoding="utf-8"), end="\n" if args.path else "")
    return 0


COMMAND = Command(
    name="docs",
    help="print a page of the docs: the planning rules, the plan contract, the guides",
    description="Print a page of docs/ as installed with the package: planning-rules (how "
    "every number of a plan is decided; error messages cite its sections), plan-contract "
    "(every plan field), or a guide (--list names them all).",
    configure=configure,
    run=run,
)
