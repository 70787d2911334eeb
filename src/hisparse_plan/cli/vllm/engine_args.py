"""Flags that pick how vLLM runs the model (its version's defaults and its default modes), with
vLLM's own spellings, and the line that says which of them a plan assumed."""

from __future__ import annotations

import argparse
from dataclasses import replace

from hisparse_plan.cli.arg_types import positive_int
from hisparse_plan.models import PlanRequest
from hisparse_plan.presets import Settings
from hisparse_plan.presets.settings import DEFAULT_VLLM, VLLM_VERSIONS, vllm_version

HYBRID_KINDS = frozenset({
    "sliding_window", "chunked_local_attention", "sliding_window_mla", "mamba",
})
"""Layer kinds whose plan depends on vLLM's hybrid KV cache manager."""


def add_engine_arguments(group: argparse._ArgumentGroup) -> None:
    versions = ", ".join(VLLM_VERSIONS)
    group.add_argument("--vllm", dest="vllm_version", choices=VLLM_VERSIONS, metavar="VERSION",
                       help=f"plan as this vLLM release runs by default ({versions}; default "
                            f"{DEFAULT_VLLM}): its default block size (16 on 0.33, 64 on 0.34)")
    caching = group.add_mutually_exclusive_group()
    caching.add_argument("--enable-prefix-caching", dest="prefix_caching", action="store_true",
                         default=None,
                         help="prefix caching on (vLLM's default): Mamba hybrids cache their "
                              "states in align mode")
    caching.add_argument("--no-enable-prefix-caching", dest="prefix_caching",
                         action="store_false",
                         help="prefix caching off: one Mamba state block per request")
    manager = group.add_mutually_exclusive_group()
    manager.add_argument("--enable-hybrid-kv-cache-manager", dest="hybrid_manager",
                         action="store_true", default=None,
                         help="keep vLLM's hybrid KV cache manager for chunked-local models "
                              "(vLLM turns it off for them by default)")
    manager.add_argument("--disable-hybrid-kv-cache-manager", dest="hybrid_manager",
                         action="store_false",
                         help="one KV cache manager: sliding-window and chunked-local layers "
                              "take a block for every token")
    group.add_argument("-dcp", "--decode-context-parallel-size", dest="dcp", type=positive_int,
                       metavar="N",
                       help="decode context parallel ranks (default 1; a divisor of the TP "
                            "ranks): each holds 1/N of a sharded layer's tokens")


def engine_settings(args: argparse.Namespace, settings: Settings) -> Settings:
    """`settings` with what the engine flags say."""
    return replace(
        settings,
        vllm=args.vllm_version,
        prefix_caching=args.prefix_caching,
        hybrid_kv_cache_manager=args.hybrid_manager,
        dcp=args.dcp,
    )


def titled(title: str, settings: Settings, request: PlanRequest) -> str:
    """`title` with what a regular plan assumed of the engine (a HiSparse plan's fixed rows and
    blocks do not depend on it)."""
    if request.hisparse is not None:
        return title
    return f"{title} ({assumptions(settings, request)})"


def assumptions(settings: Settings, request: PlanRequest) -> str:
    """What the plan assumed of the engine, in a few words for a heading."""
    scheduler = request.scheduler
    kinds = {spec.kind for spec in request.layers.values()}
    words = [f"vLLM {vllm_version(settings)} defaults"]
    if "mamba" in kinds:
        words.append(f"Mamba cache mode {request.model.mamba_cache_mode}")
    if kinds & HYBRID_KINDS:
        words.append("hybrid KV cache manager " + (
            "off" if scheduler.disable_hybrid_kv_cache_manager else "on"))
    if scheduler.decode_context_parallel_size > 1:
        words.append(f"DCP {scheduler.decode_context_parallel_size}")
    return ", ".join(words)
