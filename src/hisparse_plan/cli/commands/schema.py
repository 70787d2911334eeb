"""`hisparse-plan schema`: the JSON Schemas of the request and plan contracts."""

from __future__ import annotations

import argparse
import json
from typing import Any

from hisparse_plan.cli.command import Command
from hisparse_plan.operator import json_schemas

DRAFT = "https://json-schema.org/draft/2020-12/schema"
"""The dialect pydantic writes; a validator reads `$schema` to know it."""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("which", nargs="?", choices=("request", "plan", "sglang-plan", "all"),
                        default="all",
                        help="one schema (plan: vLLM's; sglang-plan: SGLang's), or all as "
                             "{\"request\": ..., \"plan\": ..., \"sglang-plan\": ...} "
                             "(default)")
    parser.add_argument("--json", action="store_true",
                        help="accepted for symmetry: a schema is always JSON")


def declared(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema with `$schema` first, naming its draft."""
    return {"$schema": DRAFT, **schema}


def run(args: argparse.Namespace) -> int:
    schemas = {name: declared(schema) for name, schema in json_schemas().items()}
    chosen = schemas if args.which == "all" else schemas[args.which]
    print(json.dumps(chosen, indent=2))
    return 0


COMMAND = Command(
    name="schema",
    help="JSON Schema of the plan request and of the plan",
    description="Print the JSON Schema (draft 2020-12) of a plan request and of a plan (vLLM's "
    "and SGLang's).",
    configure=configure,
    run=run,
)
