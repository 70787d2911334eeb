"""`hisparse-plan transfer SOURCE DESTINATION`: the pattern two instances' plans move for any
request (transfer_pattern.py), or with a request the rows that move its KV, proved, or the
refusal (see docs/transfer.md)."""

from __future__ import annotations

import argparse
import time

from pydantic import ValidationError

from hisparse_plan.cli.arg_types import positive_int
from hisparse_plan.cli.command import Command
from hisparse_plan.cli.commands.transfer_pattern import instantiated, show_pattern
from hisparse_plan.cli.errors import CommandError, validation_line
from hisparse_plan.cli.input_files import read_input
from hisparse_plan.cli.render import Column, Renderer
from hisparse_plan.cli.sizes import format_size
from hisparse_plan.exchange.transfer import (
    Instance,
    TransferProgram,
    TransferRequest,
    build_transfer,
    check_transfer,
    tables,
)
from hisparse_plan.exchange.transfer.facts.side import FP8_FORMATS
from hisparse_plan.models.any_plan import Plan, load_plan


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", metavar="SOURCE.json",
                        help="the source instance's plan (plan --json, either engine); '-' "
                        "for stdin")
    parser.add_argument("destination", metavar="DESTINATION.json",
                        help="the destination instance's plan")
    parser.add_argument("--tokens", type=positive_int, metavar="N",
                        help="build and prove one request of N tokens (build_transfer, the "
                        "reference) instead of the pattern")
    parser.add_argument("--run", dest="run_length", type=positive_int, metavar="BLOCKS",
                        help="give each table's blocks in runs of this many consecutive ids, "
                        "apart (default: one run)")
    parser.add_argument("--blocks", metavar="REQUEST.json",
                        help="instantiate the proved pattern for this request: a "
                        "TransferRequest (num_tokens, source_blocks and destination_blocks "
                        "per table)")
    parser.add_argument("--source-tp", type=positive_int, default=1, metavar="N",
                        help="tensor-parallel ranks of the source (each with this plan)")
    parser.add_argument("--destination-tp", type=positive_int, default=1, metavar="N",
                        help="tensor-parallel ranks of the destination")
    parser.add_argument("--kv-heads", type=positive_int, metavar="N",
                        help="the model's KV heads, when fewer than the ranks")
    for side in ("source", "destination"):
        parser.add_argument(f"--{side}-cache-dtype", choices=sorted(FP8_FORMATS), metavar="DTYPE",
                            help=f"the {side} engine's --kv-cache-dtype: its plan stores an fp8 "
                            "cache as uint8 without saying whether it is e4m3 or e5m2")
    parser.add_argument("--json", action="store_true",
                        help="print the pattern (or the request's program) as JSON")
    parser.add_argument("--plain", action="store_true",
                        help="plain text, even when rich is installed")


def _plan(path: str, flag: str) -> Plan:
    try:
        return load_plan(read_input(path, flag))
    except ValidationError as error:
        raise CommandError(f"{flag} {path}: not a valid plan: {validation_line(error)}"
                           ) from None


def blocks_in_runs(plan: Plan, tokens: int, run: int | None) -> dict[str, list[int]]:
    """Each table's blocks for `tokens`: from its first usable id, in runs of `run`
    consecutive ids one id apart (one run without `run`); tables that share a pool take
    ids after one another."""
    found: dict[str, list[int]] = {}
    next_free: dict[int, int] = {}
    for key, table in tables(plan).items():
        count = 1 if table.state else -(-tokens // table.block_tokens)
        at = next_free.get(table.num_blocks, table.padding_blocks)
        ids: list[int] = []
        while len(ids) < count:
            step = count - len(ids) if run is None else min(run, count - len(ids))
            ids.extend(range(at, at + step))
            at += step + (0 if run is None else 1)
        if at > table.num_blocks:
            raise CommandError(f"table {key!r}: {tokens} tokens take blocks up to {at - 1}; "
                               f"the pool has {table.num_blocks}")
        next_free[table.num_blocks] = at
        found[key] = ids
    return found


def _request(args: argparse.Namespace, source: Plan, destination: Plan) -> TransferRequest:
    if args.blocks is not None:
        try:
            return TransferRequest.model_validate_json(read_input(args.blocks, "--blocks"))
        except ValidationError as error:
            raise CommandError(f"--blocks {args.blocks}: not a TransferRequest: "
                               f"{validation_line(error)}") from None
    return TransferRequest(num_tokens=args.tokens,
                           source_blocks=blocks_in_runs(source, args.tokens, args.run_length),
                           destination_blocks=blocks_in_runs(destination, args.tokens,
                                                             args.run_length))


def run(args: argparse.Namespace) -> int:
    if args.source == "-" and args.destination == "-":
        raise CommandError("SOURCE and DESTINATION cannot both be '-': standard input holds "
                           "one file")
    source, destination = _plan(args.source, "SOURCE"), _plan(args.destination, "DESTINATION")
    src = Instance([source] * args.source_tp, total_kv_heads=args.kv_heads,
                   cache_dtype=args.source_cache_dtype)
    dst = Instance([destination] * args.destination_tp, total_kv_heads=args.kv_heads,
                   cache_dtype=args.destination_cache_dtype)
    if args.blocks is None and args.tokens is None:
        return show_pattern(args, src, dst)
    request = _request(args, source, destination)
    started = time.perf_counter()
    program = build_transfer(src, dst, request) if args.blocks is None else \
        instantiated(src, dst, request)
    built = time.perf_counter()
    proof = check_transfer(program, src, dst)
    proved = time.perf_counter()
    if args.json:
        print(program.model_dump_json(indent=1))
        return 0
    render(Renderer(plain=args.plain), args, program, proof.boxes,
           ((built - started) * 1e3, (proved - built) * 1e3))
    return 0


def render(out: Renderer, args: argparse.Namespace, program: TransferProgram, boxes: int,
           times: tuple[float, float]) -> None:
    request = program.request
    out.heading(f"{args.source} -> {args.destination}: one request of {request.num_tokens} "
                "tokens")
    out.pairs([
        ("layers moved", str(len(program.layers))),
        ("rows", str(len(program.rows))),
        ("descriptors (contiguous chunks)", str(program.descriptors)),
        ("bytes", f"{program.bytes} ({format_size(program.bytes)})"),
        ("built in" if args.blocks is None else "pattern compiled, proved and instantiated in",
         f"{times[0]:.1f} ms"),
        ("proved by check_transfer in", f"{times[1]:.1f} ms ({boxes} logical boxes)"),
    ])
    pools = [{region.name: region.pool for region in rank.regions} for rank in program.source]
    targets = [{region.name: region.pool for region in rank.regions}
               for rank in program.destination]
    pairs: dict[tuple[int, str, int, str], list[int]] = {}
    for row in program.rows:
        key = (row.src_rank, pools[row.src_rank][row.src_region], row.dst_rank,
               targets[row.dst_rank][row.dst_region])
        found = pairs.setdefault(key, [0, 0, 0])
        found[0] += 1
        found[1] += row.count
        found[2] += row.bytes
    out.line()
    out.table(
        [Column("from rank:pool"), Column("to rank:pool"), Column("rows", "right"),
         Column("descriptors", "right"), Column("bytes", "right")],
        [[f"{src}:{pool}", f"{dst}:{target}", str(rows), str(chunks), format_size(size)]
         for (src, pool, dst, target), (rows, chunks, size) in sorted(pairs.items())],
    )


COMMAND = Command(
    name="transfer",
    help="the proved pattern (or one request's rows) that moves KV from one plan to another",
    description="Compile the transfer pattern that moves any request's KV from a source "
    "instance (SOURCE, a plan of either engine, on --source-tp ranks) to a destination "
    "instance and prove it with check_pattern: per pair of block tables, its rule, rows and "
    "copies per period and the copies a connector prepares. --blocks FILE instantiates it "
    "for one request (a TransferRequest); --tokens N builds one request's program with "
    "build_transfer (the reference; blocks in runs of --run) instead; every program is "
    "proved with check_transfer. --json prints the pattern or the program. A pair that "
    "cannot move as bytes is refused naming the layer, the field and both values (see "
    "docs/transfer.md).",
    configure=configure,
    run=run,
)
