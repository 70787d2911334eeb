"""`hisparse-plan manifest`: the plan's memory regions and layer geometry for KV transfer."""

from __future__ import annotations

import argparse

from hisparse_plan.cli.command import Command
from hisparse_plan.cli.engines import add_plan_arguments, make_plan, resolve_source
from hisparse_plan.cli.render import Column, Renderer
from hisparse_plan.cli.sizes import format_size
from hisparse_plan.exchange import LayerEntry, TransferManifest, manifest


def run(args: argparse.Namespace) -> int:
    source = resolve_source(args)
    result = manifest(make_plan(source.request))
    if args.json:
        print(result.model_dump_json(indent=2))
        return 0
    render_manifest(Renderer(plain=args.plain), source.title, result)
    return 0


def _shape(values: list[int]) -> str:
    return "(" + ",".join(map(str, values)) + ")"


def _by_tensor(result: TransferManifest) -> dict[int, list[LayerEntry]]:
    by_tensor: dict[int, list[LayerEntry]] = {}
    for entry in result.layers:
        by_tensor.setdefault(entry.tensor, []).append(entry)
    return dict(sorted(by_tensor.items()))


def _tensor_rows(by_tensor: dict[int, list[LayerEntry]]) -> list[list[str]]:
    """One row per tensor: its layers share all but the offset (the first layer's is shown)."""
    rows = []
    for index, entries in by_tensor.items():
        first = entries[0]
        rows.append([
            str(index), first.region, str(first.offset),
            str(first.layer_stride), str(first.block_stride), str(first.page_bytes),
            first.dtype, _shape(first.block_shape), _shape(first.block_strides),
        ])
    return rows


def render_manifest(out: Renderer, title: str, result: TransferManifest) -> None:
    out.heading(f"{title}: transfer manifest")
    out.pairs([
        ("fingerprint", result.fingerprint),
        *((f"{region.name}", format_size(region.size)) for region in result.regions),
    ])
    out.line()
    out.table(
        [Column("region"), Column("bytes", "right"),
         Column("alignment", "right"), Column("blocks", "right"),
         Column("bytes/block", "right"), Column("block stride", "right"), Column("layout"),
         Column("shared")],
        [[r.name, str(r.size), str(r.alignment), str(r.num_blocks),
          str(r.bytes_per_block), str(r.block_stride), r.layout.value,
          "yes" if r.shared else "no"]
         for r in result.regions],
        title="regions",
    )
    by_tensor = _by_tensor(result)
    out.table(
        [Column("#", "right"), Column("region"), Column("offset", "right"),
         Column("layer stride", "right"), Column("block stride", "right"),
         Column("page", "right"), Column("dtype"), Column("block shape", "right"),
         Column("byte strides", "right")],
        _tensor_rows(by_tensor),
        title="tensors: layer l's page of block b at offset + l * layer stride + b * block stride",
    )
    for index, entries in by_tensor.items():
        names = entries[0].name if len(entries) == 1 else (
            f"{len(entries)} layers, {entries[0].name} ... {entries[-1].name}")
        derived = " (derived on the GPU, not transferred)" if entries[0].derived else ""
        out.line(f"{index:>3}  {names}{derived}")
    out.line()
    out.line(f"{len(result.layers)} layers; --json lists each with its own offset and view.")


COMMAND = Command(
    name="manifest",
    help="memory regions and per-layer page geometry for a KV-transfer engine",
    description="Plan, then print what a KV-transfer engine (NIXL, Mooncake, LMCache) needs "
    "to register the pools and move pages between instances: every pool as a region (size, "
    "alignment, blocks), every layer's offset, strides, page bytes, dtype and per-block view, "
    "and the layout fingerprint. --json prints the whole manifest.",
    configure=add_plan_arguments,
    run=run,
)
