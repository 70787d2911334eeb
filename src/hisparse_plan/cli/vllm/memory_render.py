"""`plan --gpu NAME`: where each byte of one rank's HBM went (the rows add up to the HBM), the
vLLM sizing it assumed, and the whole deployment, every rank counted."""

from __future__ import annotations

from typing import Any

from hisparse_plan.cli.render import Column, Renderer, concurrency
from hisparse_plan.cli.sizes import format_size
from hisparse_plan.models import KVCachePlan
from hisparse_plan.operator.node import Ranks, node_figures
from hisparse_plan.presets.hardware import MemoryBreakdown


def gpu_title(title: str, breakdown: MemoryBreakdown, kv_override: int | None) -> str:
    """`title` with the GPU and what its KV memory assumed: vLLM's sizing, or a given size."""
    if kv_override is not None:
        return f"{title} on {breakdown.gpu.name}, KV memory given"
    return f"{title} on {breakdown.gpu.name}, {breakdown.sizing.words}"


def memory_rows(
    breakdown: MemoryBreakdown, plan: KVCachePlan, kv_override: int | None
) -> list[tuple[str, int]]:
    """(what, bytes) rows for stage 0's rank; they sum to the GPU's HBM exactly."""
    pool = plan.device_pools[0]
    if kv_override is not None:
        rows = [("not for the KV cache (--gpu-mem / --kv-cache-memory given)",
                 breakdown.hbm - kv_override)]
        kv = kv_override
    else:
        rows = list(breakdown.parts[:-1])
        kv = breakdown.kv_cache
    rows.append((f"KV cache pool ({plan.num_blocks} blocks of {pool.bytes_per_block} B)",
                 pool.size))
    rows.append(("KV cache left over (under one block)", kv - pool.size))
    return rows


def render_rank_memory(
    out: Renderer, breakdown: MemoryBreakdown, plan: KVCachePlan, kv_override: int | None,
    split: str = "tp x pp",
) -> None:
    """The rows, their total (the HBM), over how many ranks (`split`) the weights went, and
    what vLLM's sizing measures and leaves out."""
    rows = memory_rows(breakdown, plan, kv_override)
    total = sum(nbytes for _, nbytes in rows)
    table = [[what, str(nbytes), format_size(nbytes)] for what, nbytes in rows]
    table.append([f"HBM of one {breakdown.gpu.title}", str(total), format_size(total)])
    out.table(
        [Column("one rank's HBM"), Column("bytes", "right"), Column("", "right")],
        table,
        title=f"memory per rank ({breakdown.ranks} ranks: {split})",
    )
    if kv_override is None:
        out.line(f"sizing: {breakdown.sizing.explained}")


def deployment_totals(
    breakdown: MemoryBreakdown, plan: KVCachePlan, ranks: Ranks, *,
    expert_parallel: bool = False, max_num_seqs: int | None = None,
) -> dict[str, Any]:
    """The whole deployment, every rank of it (tp x pp x dp): its GPUs and their HBM, the
    weights they hold (a copy per DP rank, or one copy with the experts sharded over the DP
    ranks too), every device pool, every host pool, and the max_model_len requests all its DP
    ranks serve at once (`operator.node`)."""
    node = node_figures(plan, ranks, max_num_seqs)
    copies = 1 if expert_parallel else ranks.dp
    return {
        "gpus": node.gpus,
        "gpu": breakdown.gpu.name,
        "tp": node.tp,
        "pp": node.pp,
        "dp": node.dp,
        "hbm_bytes": breakdown.hbm * node.gpus,
        "weights_bytes": breakdown.model_weights * copies,
        "kv_cache_bytes": node.kv_cache_bytes,
        "host_pools": node.host_pools,
        "host_pool_bytes": node.host_pool_bytes,
        "per_dp_rank_concurrency": node.per_dp_rank_concurrency,
        "max_concurrency": node.max_concurrency,
    }


def memory_json(
    breakdown: MemoryBreakdown, plan: KVCachePlan, kv_override: int | None, ranks: Ranks, *,
    expert_parallel: bool = False, max_num_seqs: int | None = None,
) -> dict[str, Any]:
    """The HBM rows of one rank (as the text table shows them), the sizing assumed, and the
    deployment's totals."""
    rows = memory_rows(breakdown, plan, kv_override)
    keys: tuple[str, ...] = (("not_for_kv_cache",) if kv_override is not None
            else ("held_back", "weights", "activation_reserve"))
    keys += ("kv_cache_pool", "kv_cache_left_over")
    sizing = breakdown.sizing
    return {
        "gpu": breakdown.gpu.name,
        "hbm_bytes": breakdown.hbm,
        "gpu_memory_utilization": float(breakdown.utilization),
        "sizing": {
            "vllm": sizing.vllm,
            "extensible_kv_cache": sizing.extensible,
            "gpu_memory_utilization": sizing.utilization,
            "given": sizing.given,
            "kv_memory_given": kv_override is not None,
        },
        "ranks": breakdown.ranks,
        "per_rank": [{"part": key, "what": what, "bytes": nbytes}
                     for key, (what, nbytes) in zip(keys, rows, strict=True)],
        "deployment": deployment_totals(breakdown, plan, ranks, expert_parallel=expert_parallel,
                                        max_num_seqs=max_num_seqs),
    }


def render_deployment(
    out: Renderer, breakdown: MemoryBreakdown, plan: KVCachePlan, ranks: Ranks, *,
    expert_parallel: bool = False, max_num_seqs: int | None = None,
) -> None:
    totals = deployment_totals(breakdown, plan, ranks, expert_parallel=expert_parallel,
                               max_num_seqs=max_num_seqs)
    copies = "" if expert_parallel or ranks.dp == 1 else f" ({ranks.dp} copies)"
    host = ""
    if totals["host_pool_bytes"] is not None:
        host = (f", host DRAM {format_size(totals['host_pool_bytes'])} "
                f"({totals['host_pools']} host pool{'s' if totals['host_pools'] > 1 else ''})")
    out.line(
        f"deployment: {totals['gpus']} x {breakdown.gpu.title} "
        f"(tp {ranks.tp} x pp {ranks.pp} x dp {ranks.dp}): weights "
        f"{format_size(totals['weights_bytes'])}{copies}, KV cache "
        f"{format_size(totals['kv_cache_bytes'])}{host}, "
        f"{concurrency(totals['max_concurrency'])} concurrent max_model_len requests"
    )
