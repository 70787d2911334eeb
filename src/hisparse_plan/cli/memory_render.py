"""`plan --gpu NAME`: where each byte of one rank's HBM went. The rows add up to the HBM."""

from __future__ import annotations

from hisparse_plan.cli.render import Column, Renderer
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
