"""`hisparse-plan models`: the shipped presets and the config.json fields they come from."""

from __future__ import annotations

import argparse
import json

from hisparse_plan.cli.command import Command
from hisparse_plan.cli.render import Column, Renderer
from hisparse_plan.cli.source import add_output_arguments
from hisparse_plan.presets import presets


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
                    "description": preset.description,
                    "config": preset.architecture.model_dump(exclude_none=True),
                }
                for name, preset in shipped.items()
            },
            indent=2,
        ))
        return 0
    rows = []
    for name, preset in shipped.items():
        arch = preset.architecture
        rows.append([
            name,
            str(arch.num_hidden_layers),
            str(sum(arch.leaders())),
            f"{arch.kv_lora_rank}+{arch.qk_rope_head_dim}",
            str(arch.index_head_dim),
            str(arch.index_topk),
            str(arch.max_position_embeddings),
        ])
    out = Renderer(plain=args.plain)
    out.table(
        [Column("model"), Column("layers", "right"), Column("indexers", "right"),
         Column("latent+rope", "right"), Column("index dim", "right"),
         Column("topk", "right"), Column("max positions", "right")],
        rows,
        title="presets, from each model's config.json",
    )
    for preset in shipped.values():
        out.line(f"{preset.name}: {preset.description}")
    return 0


COMMAND = Command(
    name="models",
    help="list the model presets",
    description="The shipped model presets and the config.json fields each is built from.",
    configure=configure,
    run=run,
)
