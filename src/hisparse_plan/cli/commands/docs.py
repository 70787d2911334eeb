"""`hisparse-plan docs`: the planning rules and the plan contract that error messages cite,
printed from the installed package."""

from __future__ import annotations

import argparse

from hisparse_plan.cli.command import Command
from hisparse_plan.rule_docs import DOC_NAMES, doc_path


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", nargs="?", choices=DOC_NAMES, default=DOC_NAMES[0],
                        help="which doc (default planning-rules); a message's "
                             "docs/planning-rules.md#admission is `docs planning-rules`, "
                             "section Admission")
    parser.add_argument("--path", action="store_true",
                        help="print where the file is instead of its text")


def run(args: argparse.Namespace) -> int:
    path = doc_path(args.name)
    print(path if args.path else path.read_text(encoding="utf-8"), end="\n" if args.path else "")
    return 0


COMMAND = Command(
    name="docs",
    help="print the planning rules or the plan contract (what error messages cite)",
    description="Print docs/planning-rules.md (how every number of a plan is decided; error "
    "messages cite its sections) or docs/plan-contract.md (every plan field), as installed "
    "with the package.",
    configure=configure,
    run=run,
)
