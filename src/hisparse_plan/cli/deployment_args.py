"""Flags that describe the deployment around the cache (context guard, regular planning,
pipeline stages, hardware, speculative decoding), kept apart from `source.py` so that each
module stays one idea. `source.py` calls the two hooks below."""

from __future__ import annotations

import argparse
from dataclasses import replace

from hisparse_plan.cli.arg_types import positive_int, size_arg
from hisparse_plan.presets import Settings


def size_list(text: str) -> tuple[int, ...]:
    """Comma-separated sizes, one per pipeline stage: `9GiB,10GiB,10GiB,12GiB`."""
    parts = [part.strip() for part in text.split(",")]
    if not all(parts):
        raise argparse.ArgumentTypeError(f"expected sizes separated by commas, got {text!r}")
    return tuple(size_arg(part) for part in parts)


def add_deployment_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--allow-long-context", action="store_true",
                       help="plan a --max-model-len above the model's max_position_embeddings "
                            "(refused otherwise: the model was not trained for it)")
    group.add_argument("--no-hisparse", action="store_true",
                       help="plan a sparse-MLA preset (deepseek-v3.2, glm-5) without HiSparse: "
                            "every latent and indexer cache a regular layer on the GPU")
    group.add_argument("--pp", type=positive_int, metavar="N",
                       help="pipeline stages (default 1): decoder layers split as vLLM splits "
                            "them, each stage with --gpu-mem (or its --stage-gpu-mem)")
    group.add_argument("--stage-gpu-mem", type=size_list, metavar="LIST",
                       help="KV-cache memory of each pipeline stage, e.g. 9GiB,10GiB,10GiB,12GiB")
    group.add_argument("--auto-fit", action="store_true",
                       help="shorten max_model_len to what the GPU memory holds (regular plans)")


def deployment_settings(args: argparse.Namespace, settings: Settings) -> Settings:
    """`settings` with what the deployment flags say."""
    return replace(
        settings,
        allow_long_context=True if args.allow_long_context else None,
        hisparse=False if args.no_hisparse else None,
        pp=args.pp,
        stage_gpu_mem_bytes=args.stage_gpu_mem,
        auto_fit=True if args.auto_fit else None,
    )
