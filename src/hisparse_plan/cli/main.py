"""The `hisparse-plan` command."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

from pydantic import ValidationError

from hisparse_plan.cli.errors import one_line
from hisparse_plan.errors import PlanError
from hisparse_plan.models import KVCachePlan, PlanRequest
from hisparse_plan.planning import plan

Command = Callable[[argparse.Namespace], int]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, like every other refusal (argparse would print the usage first).
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def _load_request(path: str) -> PlanRequest:
    return PlanRequest.model_validate_json(Path(path).read_bytes())


def _print_summary(result: KVCachePlan) -> None:
    host = result.host_pool
    print(f"groups: {len(result.groups)}  tensors: {len(result.tensors)}")
    print(
        f"device pool: {result.num_blocks} blocks x {result.device_pool.bytes_per_block} bytes "
        f"= {result.device_pool.size} bytes ({result.device_pool.layout.value})"
    )
    if host is not None:
        print(f"host pool: {host.num_blocks} blocks x {host.bytes_per_block} bytes = {host.size} bytes")
    print(f"max concurrency: {result.capacity.max_concurrency:.4f}")
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)


def _run_plan(args: argparse.Namespace) -> int:
    result = plan(_load_request(args.request))
    if args.json:
        print(result.model_dump_json(indent=2))
    else:
        _print_summary(result)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="hisparse-plan", description="Plan a HiSparse KV cache.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    plan_cmd = commands.add_parser("plan", help="plan a request")
    plan_cmd.add_argument("--request", required=True, help="plan request JSON file")
    plan_cmd.add_argument("--json", action="store_true", help="print the whole plan as JSON")
    plan_cmd.set_defaults(run=_run_plan)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    run: Command = args.run
    try:
        return run(args)
    except BrokenPipeError:
        # The reader went away (`| head`): not an error; silence the flush at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (PlanError, ValidationError, OSError, json.JSONDecodeError) as error:
        print(f"error: {one_line(error)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
