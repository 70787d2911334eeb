"""vLLM's part of `hisparse-plan plan` and `explain`: the request its flags give, planned and
shown."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

from hisparse_plan.cli.deployment_args import given_memory_breakdown, kv_cache_override
from hisparse_plan.cli.render import Column, Renderer, concurrency
from hisparse_plan.cli.serving import show_serving
from hisparse_plan.cli.sizes import format_size
from hisparse_plan.cli.vllm.gpu_layout import check_for, with_backends
from hisparse_plan.cli.vllm.memory_render import (
    gpu_title,
    memory_json,
    render_deployment,
    render_rank_memory,
)
from hisparse_plan.cli.vllm.regular_render import group_rows, render_regular_plan
from hisparse_plan.cli.vllm.source import Source, resolve_source
from hisparse_plan.models import KVCacheGroup, KVCachePlan, MLASpec
from hisparse_plan.operator import Explanation, PoolBounds, explain, pool_bounds
from hisparse_plan.operator.node import Ranks
from hisparse_plan.targets.vllm import plan as make_plan

LABELS = {
    "hisparse_resident": "resident",
    "hisparse_hot": "hot",
}


def run_plan(args: argparse.Namespace) -> int:
    """`plan` for vLLM: its groups, pools, one request's footprint and capacity, or the plan as
    JSON; with --gpu, where each byte of HBM went."""
    source = resolve_source(args)
    result = make_plan(source.request)
    if source.platform is not None:
        check_for(result, source.request, source.platform)
    kv_override = kv_cache_override(args, args.gpu_mem)
    breakdown = given_memory_breakdown(args, kv_override)
    ranks = Ranks(tp=args.tp or 1, pp=len(result.device_pools), dp=args.dp or 1)
    deployed = {"expert_parallel": args.enable_expert_parallel,
                "max_num_seqs": args.max_num_seqs}
    if args.json:
        if breakdown is None:
            print(result.model_dump_json(indent=2))
        else:
            # With --gpu: the plan beside where each byte of HBM went.
            body = {"plan": result.model_dump(mode="json"),
                    "memory": memory_json(breakdown, result, kv_override, ranks, **deployed)}
            print(json.dumps(body, indent=2))
        return 0
    out = Renderer(plain=args.plain)
    if breakdown is not None:
        source = replace(source, title=gpu_title(source.title, breakdown, kv_override))
    if result.host_pool is None:
        render_regular_plan(out, source.title, result, source.kv_dtype)
    else:
        render_plan(out, source, result)
    show_serving(out, args, result.capacity.max_concurrency)
    if breakdown is not None:
        out.line()
        split = "tp x dp x pp" if args.enable_expert_parallel else "tp x pp"
        render_rank_memory(out, breakdown, result, kv_override, split)
        render_deployment(out, breakdown, result, ranks, **deployed)
    return 0


def explain_plan(args: argparse.Namespace) -> tuple[str, Explanation]:
    """`explain` for vLLM: the request's title and every number of its plan, from the
    config.json fields of a preset or config.json."""
    source = resolve_source(args)
    explained = explain(source.request, architecture=source.config or source.architecture,
                        kv_dtype=source.kv_dtype)
    return source.title, with_backends(explained, source.platform)


def describe(source: Source, plan: KVCachePlan) -> str:
    """One line: the model, its cache dtype, block size, context and pools' sharing."""
    request = source.request
    spec = next(
        (s for s in request.layers.values() if isinstance(s, MLASpec) and s.cache_role == "sparse"),
        None,
    )
    dtype = source.kv_dtype or (spec.cache_dtype or spec.dtype if spec is not None else "?")
    parts = [
        f"{dtype}",
        f"block {plan.groups[0].spec.block_size}",
        f"max_model_len {plan.workload.max_model_len}",
        f"{plan.device_pool.layout.value}",
    ]
    if plan.host_pool is not None and plan.host_pool.shared:
        parts.append("host pool shared by the node's TP ranks")
    return f"{source.title}: " + ", ".join(parts)


def _label(group: KVCacheGroup) -> str:
    if group.role == "hisparse_source":
        return "source (host)"
    if group.role == "hisparse_indexer":
        return "indexer"
    return LABELS.get(group.spec.kind, f"regular ({group.spec.kind})")


def hisparse_group_rows(plan: KVCachePlan, bounds: PoolBounds) -> list[list[str]]:
    blocks = {demand.group: demand.blocks for demand in bounds.demands}
    needs = [blocks.get(index, bounds.host_required) for index in range(len(plan.groups))]
    return group_rows(plan, [_label(group) for group in plan.groups], needs)


def render_plan(out: Renderer, source: Source, plan: KVCachePlan) -> None:
    bounds = pool_bounds(plan)
    host = plan.host_pool
    device = plan.device_pool
    out.heading(describe(source, plan))
    out.table(
        [Column("#", "right"), Column("group"), Column("layers", "right"),
         Column("page", "right"), Column("blocks/request", "right")],
        hisparse_group_rows(plan, bounds),
        title="groups",
    )
    pools = []
    if host is not None:
        pools.append(["host", str(host.num_blocks), str(host.block_stride),
                      format_size(host.size), f"{format_size(host.budget_bytes)} budget"])
    pools.append(["device", str(plan.num_blocks), str(device.bytes_per_block),
                  format_size(device.size), f"{format_size(device.available_bytes)} available"])
    out.table(
        [Column("pool"), Column("blocks", "right"), Column("bytes/block", "right"),
         Column("size", "right"), Column("of")],
        pools,
        title="pools",
    )
    out.table(
        [Column("pool"), Column("blocks", "right"), Column("bytes", "right")],
        [
            ["host", str(bounds.host_required), format_size(bounds.host_bytes)],
            ["device, admitted", str(bounds.admission), format_size(bounds.admission_bytes)],
            ["device, steady", str(bounds.steady), format_size(bounds.steady_bytes)],
        ],
        title=f"per request ({plan.workload.max_model_len} tokens)",
    )
    capacity = plan.capacity
    out.table(
        [Column(""), Column("max", "right"), Column("steady state", "right")],
        [
            ["host pool bound", concurrency(float(bounds.host_bound)),
             concurrency(float(bounds.host_bound))],
            ["device pool bound", concurrency(float(bounds.device_bound("max"))),
             concurrency(float(bounds.device_bound("steady")))],
            ["concurrency", concurrency(capacity.max_concurrency),
             concurrency(capacity.steady_state_concurrency)],
        ],
        title="capacity (concurrent max_model_len requests)",
    )
    out.line(f"binds: {binding_words(bounds.binding('max'))}")


def binding_words(binding: str) -> str:
    return {
        "host": "the host pool (more DRAM would help)",
        "device": "the GPU (more host pool would not help)",
        "both": "both pools, exactly",
    }[binding]
