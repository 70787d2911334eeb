"""`hisparse-plan diff A B`: are two plans (or manifests) transfer-compatible?"""

from __future__ import annotations

import argparse

from pydantic import ValidationError

from hisparse_plan.checking import check_plan
from hisparse_plan.cli.command import Command
from hisparse_plan.cli.errors import CheckFailed, CommandError, validation_line
from hisparse_plan.cli.input_files import read_input
from hisparse_plan.cli.render import Renderer
from hisparse_plan.errors import PlanInvariantError
from hisparse_plan.exchange import TransferManifest, diff
from hisparse_plan.models import KVCachePlan
from hisparse_plan.models.untrusted_json import parse_json_text


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("a", metavar="A.json",
                        help="a plan (plan --json) or a manifest (manifest --json); '-' for stdin")
    parser.add_argument("b", metavar="B.json", help="the other plan or manifest")
    parser.add_argument("--json", action="store_true", help="print JSON for machines")
    parser.add_argument("--plain", action="store_true",
                        help="plain text, even when rich is installed")


def load_side(path: str) -> KVCachePlan | TransferManifest:
    """A plan or a manifest JSON file, told apart by `manifest_version`; a plan is proved
    sound first (two copies of one broken plan agree with each other, and are no use)."""
    raw = read_input(path, "diff")
    data = parse_json_text(raw, what="plan", label=path)  # duplicate keys refused
    is_manifest = "manifest_version" in data
    what = TransferManifest if is_manifest else KVCachePlan
    try:
        side = what.model_validate(data)  # the text parsed once, above
    except ValidationError as error:
        kind = "manifest" if is_manifest else "plan (or a manifest with manifest_version)"
        raise CommandError(f"{path}: not a valid {kind}: {validation_line(error)}") from None
    if isinstance(side, KVCachePlan):
        try:
            check_plan(side)
        except PlanInvariantError as error:
            raise CommandError(f"{path}: not a sound plan: {error}") from None
    return side


def run(args: argparse.Namespace) -> int:
    if args.a == "-" and args.b == "-":
        raise CommandError("A and B cannot both be '-': standard input holds one file")
    result = diff(load_side(args.a), load_side(args.b))
    if args.json:
        print(result.model_dump_json(indent=2))
        return 0 if result.compatible else 1
    if not result.compatible:  # one error line says it all, as verify's faults do
        raise CheckFailed(f"not transfer-compatible: {result.message}")
    Renderer(plain=args.plain).line(f"A = {args.a}, B = {args.b}: {result.message}")
    return 0


COMMAND = Command(
    name="diff",
    help="whether two plans (or manifests) can move KV pages between them",
    description="Compare two plans or manifests (JSON files) for KV transfer between a prefill "
    "and a decode instance: the same transferred layers, each with the same dtype, page "
    "bytes, tokens per block, per-block shape and strides, and place in its block. Block "
    "counts and pool sizes may differ. A plan is first proved sound, as check_plan does. Exit "
    "0 when compatible, 1 when not (naming the first layer and field that differ), 2 on bad "
    "input (naming the fault of a plan that is not sound).",
    configure=configure,
    run=run,
)
