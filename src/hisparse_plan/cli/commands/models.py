"""`hisparse-plan models`: the shipped presets and the config.json fields they come from."""

from __future__ import annotations

import argparse
import json
from collections import Counter

from hisparse_plan.cli.command import Command
from hisparse_plan.cli.render import Column, Renderer, add_output_arguments
from hisparse_plan.presets import ModelArchitecture, RegularArchitecture, presets


def configure(parser: argparse.ArgumentParser) -> None:
    add_output_arguments(parser)


def run(args: argparse.Namespace) -> int:
    shipped = presets()
    if args.json:
        print(json.dumps(
            {
                name: {
                    "title": preset.title,
                    "aliases": list(preset.aliases),
                    "kind": "sparse_mla" if preset.sparse_architecture else "regular",
                    "description": preset.description,
                    "source": preset.source,
                    "config": preset.architecture.model_dump(exclude_none=True),
                    "weights": None if preset.weights is None else {
                        "parameters": preset.weights.parameters,
                        "bits_per_parameter": preset.weights.bits_per_parameter,
                        "source": preset.weights.source,
                    },
                }
                for name, preset in shipped.items()
            },
            indent=2,
        ))
        return 0
    sparse_rows = []
    regular_rows = []
    for name, preset in shipped.items():
        arch = preset.architecture
        if isinstance(arch, ModelArchitecture):
            sparse_rows.append([
                name,
                str(arch.num_hidden_layers),
                str(sum(arch.leaders())),
                f"{arch.kv_lora_rank}+{arch.qk_rope_head_dim}",
                str(arch.index_head_dim),
                str(arch.index_topk),
                str(arch.max_position_embeddings),
            ])
        else:
            regular_rows.append(_regular_row(name, arch))
    out = Renderer(plain=args.plain)
    out.table(
        [Column("model"), Column("layers", "right"), Column("indexers", "right"),
         Column("latent+rope", "right"), Column("index dim", "right"),
         Column("topk", "right"), Column("max positions", "right")],
        sparse_rows,
        title="sparse-MLA presets (HiSparse), from each model's config.json",
    )
    out.table(
        [Column("model"), Column("layers", "right"), Column("kinds"),
         Column("kv heads x dim", "right"), Column("max positions", "right")],
        regular_rows,
        title="regular presets (no HiSparse), from each model's config.json",
    )
    for preset in shipped.values():
        out.line(f"{preset.name}: {preset.description}")
    return 0


def _regular_row(name: str, arch: RegularArchitecture) -> list[str]:
    counts = Counter(arch.layer_kinds())
    kinds = " + ".join(f"{count} {kind}" for kind, count in counts.items())
    return [
        name,
        str(arch.num_hidden_layers),
        kinds,
        f"{arch.num_key_value_heads} x {arch.head_size}",
        str(arch.max_position_embeddings),
    ]


COMMAND = Command(
    name="models",
    help="list the model presets",
    description="The shipped model presets and the config.json fields each is built from.",
    configure=configure,
    run=run,
)
