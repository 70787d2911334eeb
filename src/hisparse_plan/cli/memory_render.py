"""`plan --gpu NAME`: where each byte of one rank's HBM went. The rows add up to the HBM."""

from __future__ import annotations

from typing import Any

from hisparse_plan.cli.render import Column, Renderer, concurrency
from hisparse_plan.cli.sizes import format_size
from hisparse_plan.models import KVCachePlan
from hisparse_plan.presets.hardware import MemoryBreakdown


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
    """The rows, their total (the HBM), and over how many ranks (`split`) the weights went."""
    rows = memory_rows(breakdown, plan, kv_override)
    total = sum(nbytes for _, nbytes in rows)
    table = [[what, str(nbytes), format_size(nbytes)] for what, nbytes in rows]
    table.append([f"HBM of one {breakdown.gpu.title}", str(total), format_size(total)])
    out.table(
        [Column("one rank's HBM"), Column("bytes", "right"), Column("", "right")],
        table,
        title=f"memory per rank ({breakdown.ranks} ranks: {split})",
    )


def deployment_totals(breakdown: MemoryBreakdown, plan: KVCachePlan) -> dict[str, Any]:
    """The whole deployment (every GPU of it): its GPUs, weights, KV-cache pools and how many
    max_model_len requests it holds at once (each rank keeps its share of every request, so
    the deployment holds what one rank's plan holds)."""
    kv_bytes = sum(pool.size for pool in plan.device_pools) * breakdown.tp
    return {
        "gpus": breakdown.ranks,
        "gpu": breakdown.gpu.name,
        "hbm_bytes": breakdown.hbm * breakdown.ranks,
        "weights_bytes": breakdown.model_weights,
        "kv_cache_bytes": kv_bytes,
        "max_concurrency": plan.capacity.max_concurrency,
    }


def memory_json(
    breakdown: MemoryBreakdown, plan: KVCachePlan, kv_override: int | None
) -> dict[str, Any]:
    """The HBM rows of one rank (as the text table shows them) and the deployment's totals."""
    rows = memory_rows(breakdown, plan, kv_override)
    keys: tuple[str, ...] = (("not_for_kv_cache",) if kv_override is not None
            else ("held_back", "weights", "activation_reserve"))
    keys += ("kv_cache_pool", "kv_cache_left_over")
    return {
        "gpu": breakdown.gpu.name,
        "hbm_bytes": breakdown.hbm,
        "gpu_memory_utilization": float(breakdown.utilization),
        "ranks": breakdown.ranks,
        "per_rank": [{"part": key, "what": what, "bytes": nbytes}
                     for key, (what, nbytes) in zip(keys, rows, strict=True)],
        "deployment": deployment_totals(breakdown, plan),
    }


def render_deployment(out: Renderer, breakdown: MemoryBreakdown, plan: KVCachePlan) -> None:
    totals = deployment_totals(breakdown, plan)
    out.line(
        f"deployment: {totals['gpus']} x {breakdown.gpu.title}: weights "
        f"{format_size(totals['weights_bytes'])}, KV cache {format_size(totals['kv_cache_bytes'])}"
        f", {concurrency(totals['max_concurrency'])} concurrent max_model_len requests"
    )
