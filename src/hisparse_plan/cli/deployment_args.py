"""Flags that describe the deployment around the cache (context guard, regular planning,
pipeline stages, hardware, speculative decoding), kept apart from `source.py` so that each
module stays one idea. `source.py` calls the two hooks below."""

from __future__ import annotations

import argparse
from dataclasses import replace

from hisparse_plan.presets import Settings


def add_deployment_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--allow-long-context", action="store_true",
                       help="plan a --max-model-len above the model's max_position_embeddings "
                            "(refused otherwise: the model was not trained for it)")


def deployment_settings(args: argparse.Namespace, settings: Settings) -> Settings:
    """`settings` with what the deployment flags say."""
    return replace(settings, allow_long_context=True if args.allow_long_context else None)
