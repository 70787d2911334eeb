"""vLLM's figures for `capacity --engine vllm`: its pools for a model on one rank."""

from __future__ import annotations

import argparse

from hisparse_plan.cli.figures import Figures
from hisparse_plan.cli.vllm.source import resolve_source
from hisparse_plan.operator.node import Ranks, node_figures
from hisparse_plan.targets.vllm import plan as plan_vllm


def _vllm_dtype(kv_dtype: str | None, spec: object) -> str:
    if kv_dtype is not None:
        return kv_dtype
    return str(getattr(spec, "dtype", "-"))


def vllm_figures(args: argparse.Namespace) -> Figures:
    source = resolve_source(args)
    result = plan_vllm(source.request)
    spec = result.groups[0].spec
    device = result.device_pool
    host = result.host_pool
    block = spec.block_size
    ranks = Ranks(tp=args.tp or 1, pp=len(result.device_pools), dp=args.dp or 1)
    node = node_figures(result, ranks, args.max_num_seqs)
    return Figures(
        engine="vllm", kv_dtype=_vllm_dtype(source.kv_dtype, spec), page_tokens=block,
        device_tokens=result.num_blocks * block,
        bytes_per_token=device.bytes_per_block / block,
        device_bytes=device.size, budget_bytes=device.available_bytes,
        context_length=result.workload.max_model_len,
        max_concurrency=result.capacity.max_concurrency,
        steady_state_concurrency=result.capacity.steady_state_concurrency,
        request_slots=args.max_num_seqs, host_bytes=None if host is None else host.size,
        dp=ranks.dp, node_concurrency=node.max_concurrency,
        node_device_bytes=node.kv_cache_bytes, node_host_bytes=node.host_pool_bytes,
    )
