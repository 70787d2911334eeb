"""`hisparse-plan transfer P D` without a request: the pattern the two plans move for any
request, proved once by check_pattern (see docs/transfer.md#the-pattern), its staged form
proved by check_staged, and which of the two the cost model picks for a loopback and a GPU
link (docs/transfer.md#staged-transfers)."""

from __future__ import annotations

import argparse
import time

from hisparse_plan.cli.render import Column, Renderer
from hisparse_plan.exchange.transfer import (
    GPU_LINK,
    LOOPBACK,
    Instance,
    TransferPattern,
    TransferProgram,
    TransferRequest,
    check_pattern,
    check_staged,
    choose,
    compile_staged,
    compile_transfer,
)

STAGED_BLOCKS = 64
"""Blocks of each slab a staging region holds (the figures shown scale with it)."""


def show_pattern(args: argparse.Namespace, src: Instance, dst: Instance) -> int:
    started = time.perf_counter()
    pattern = compile_transfer(src, dst)
    compiled = time.perf_counter()
    proof = check_pattern(pattern, src, dst)
    proved = time.perf_counter()
    staged = compile_staged(pattern, STAGED_BLOCKS)
    staged_proof = check_staged(staged, src, dst)
    if args.json:
        print(pattern.model_dump_json(indent=1))
        return 0
    out = Renderer(plain=args.plain)
    out.heading(f"{args.source} -> {args.destination}: the pattern for any request")
    out.pairs([
        ("layers moved", str(len(pattern.layers))),
        ("pattern rows (one period of each link)", str(len(pattern.rows))),
        ("compiled in", f"{(compiled - started) * 1e3:.1f} ms"),
        ("proved by check_pattern in", f"{(proved - compiled) * 1e3:.1f} ms "
         f"({proof.token_counts} token counts and residues, {proof.boxes} boxes of one "
         "period)"),
    ])
    out.line()
    out.table(
        [Column("source table"), Column("destination table"), Column("rule"),
         Column("period (units)", "right"), Column("rows", "right"),
         Column("copies/period", "right"), Column("prepared (src + dst)", "right")],
        [_link_row(pattern, index) for index in range(len(pattern.links))],
    )
    out.line()
    out.pairs([
        ("staged (proved by check_staged)",
         f"{staged_proof.slabs} slabs, {staged_proof.slab_bytes:,} B of each source block "
         f"({staged_proof.unread_bytes:,} B moved but read by no row); staging "
         f"{max(staged.staging_bytes):,} B a destination rank for {STAGED_BLOCKS} blocks, "
         f"{staged.staging_location} memory"),
        ("loopback (NIXL over UCX, DRAM)", choose(staged, LOOPBACK).describe()),
        ("GPU link (RDMA into HBM)", choose(staged, GPU_LINK).describe()),
    ])
    return 0


def _link_row(pattern: TransferPattern, index: int) -> list[str]:
    """A link: its rule, rows and copies per period, and the copies a connector prepares
    (one list entry per row and block id of each side's table)."""
    link = pattern.links[index]
    rows = [row for row in pattern.rows if row.link == index]
    copies = sum(row.count for row in rows)
    blocks = {t.name: t.num_blocks for t in pattern.source_tables}
    theirs = {t.name: t.num_blocks for t in pattern.destination_tables}
    rule = link.kind if link.window is None else f"window {link.window}"
    if link.chunk is not None:
        rule += f", chunk {link.chunk}"
    # A list entry is one row at one block: a period of P units spans P / units blocks.
    per_block = (copies * link.source_units // link.period,
                 copies * link.destination_units // link.period)
    prepared = (f"{per_block[0] * blocks[link.source_table]:,} + "
                f"{per_block[1] * theirs[link.destination_table]:,}")
    return [link.source_table, link.destination_table, rule, str(link.period),
            str(len(rows)), str(copies), prepared]


def instantiated(src: Instance, dst: Instance, request: TransferRequest) -> TransferProgram:
    """The request through the proved pattern, as a program (numpy does the selection)."""
    pattern = compile_transfer(src, dst)
    check_pattern(pattern, src, dst)
    return pattern.instantiate(request).program()
