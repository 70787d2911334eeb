"""Handshake payloads of small instances, for the connector tests (no engine, no NIXL)."""

from __future__ import annotations

from typing import Literal

from hisparse_plan.connectors.protocol import (
    HandshakePayload,
    InstanceFacts,
    Region,
    plan_fingerprint,
)
from hisparse_plan.models.any_plan import Plan

MemType = Literal["DRAM", "VRAM"]


def payloads(plans: list[Plan], instance: str, *, total_kv_heads: int | None = None,
             base: int = 1 << 32, mem_types: dict[str, MemType] | None = None
             ) -> list[HandshakePayload]:
    """One payload per TP rank (PP 1), every pool registered at made-up addresses."""
    found = []
    for rank, plan in enumerate(plans):
        regions = [Region(name=pool.name, base=base + (rank << 28) + (index << 24),
                          size=pool.size, mem_type=(mem_types or {}).get(pool.name, "DRAM"),
                          device=0)
                   for index, pool in enumerate(plan.pools)]
        found.append(HandshakePayload(
            engine=plan.engine, instance_id=instance, pp_rank=0, tp_rank=rank, pp_size=1,
            tp_size=len(plans), plan_json=plan.model_dump_json(),
            fingerprint=plan_fingerprint(plan),
            facts=InstanceFacts(total_kv_heads=total_kv_heads), regions=regions,
            agent_name=f"{instance}-{rank}", agent_metadata="00ff"))
    return found
