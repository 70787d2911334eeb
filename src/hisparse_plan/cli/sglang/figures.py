"""SGLang's figures for `capacity --engine sglang`: its pools for a model on one rank."""

from __future__ import annotations

import argparse
from typing import Any

from hisparse_plan.cli.errors import CommandError
from hisparse_plan.cli.figures import Figures
from hisparse_plan.cli.sglang.source import resolve_sglang_source
from hisparse_plan.models.sglang_plan import SGLangPlan
from hisparse_plan.models.sglang_settings import SGLangSettings
from hisparse_plan.targets.sglang.hisparse.meta import metadata_bytes
from hisparse_plan.targets.sglang.modes.parallel import attn_dp_size
from hisparse_plan.targets.sglang.pipeline import plan_traced as plan_sglang_traced


def sglang_device_bytes(plan: SGLangPlan) -> int:
    """Bytes of every device pool (a per-layer pool once per layer)."""
    return sum(pool.size * len(plan.allocation_layers(pool)) for pool in plan.pools
               if pool.location == "device")


def sglang_request_table_bytes(plan: SGLangPlan) -> int:
    """Bytes of SGLang's request-to-token table (int32), allocated beside the KV budget."""
    table = plan.req_to_token
    return table.shape[0] * table.shape[1] * 4


def sglang_host_bytes(plan: SGLangPlan) -> int | None:
    host = [pool.size for pool in plan.pools if pool.location == "host"]
    return sum(host) if host else None


def sglang_figures(args: argparse.Namespace) -> Figures:
    source = resolve_sglang_source(args)
    traced = plan_sglang_traced(source.request)
    result = traced.plan
    engine = source.request.engine
    if engine is None:  # resolve_sglang_source always sets it
        raise CommandError("--engine sglang: the request carries no SGLang settings")
    kv = next((t for t in result.tensors if t.pool == "kv"), result.tensors[0])
    # SGLang's platform defaults, and with speculative decoding the draft it resolved.
    applied = {d.subject: d for d in traced.trace.decisions
               if d.rule in ("sglang.platform", "sglang.speculative")}
    dtype: str = engine.kv_cache_dtype
    if "kv_cache_dtype" in applied:
        dtype = f"{dtype} -> {applied['kv_cache_dtype'].value}"
    return Figures(
        engine="sglang", kv_dtype=f"{dtype} ({kv.views[0].dtype} rows)",
        page_tokens=result.page_size, device_tokens=result.max_total_num_tokens,
        bytes_per_token=float(result.budget.cell_size_bytes),
        device_bytes=sglang_device_bytes(result), budget_bytes=result.budget.available_bytes,
        context_length=engine.context_length,
        max_concurrency=result.capacity.max_concurrency,
        steady_state_concurrency=result.capacity.steady_state_concurrency,
        request_slots=result.max_running_requests, host_bytes=sglang_host_bytes(result),
        beside_pools_bytes=sglang_request_table_bytes(result)
        + metadata_bytes(result.hisparse, "device"),
        beside_pools_host_bytes=metadata_bytes(result.hisparse, "host") or None,
        defaults="; ".join(f"{d.subject} {d.value} ({d.why})" for d in applied.values()),
        **_node(args, engine, result),
    )


def _node(args: argparse.Namespace, engine: SGLangSettings, plan: SGLangPlan) -> dict[str, Any]:
    """With vLLM's -dp (SGLang's DP attention on the same GPUs, sglang_ranks): the node's
    requests (each attention group holds its own pools) and every GPU's pools."""
    if (args.dp or 1) == 1 or not engine.enable_dp_attention:
        return {}
    host = sglang_host_bytes(plan)
    return {
        "node_concurrency": plan.capacity.max_concurrency * attn_dp_size(engine),
        "node_device_bytes": sglang_device_bytes(plan) * engine.tp_size,
        "node_host_bytes": None if host is None else host * engine.tp_size,
    }
