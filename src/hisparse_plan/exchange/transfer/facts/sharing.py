"""Cross-layer KV sharing across a transfer (see docs/transfer.md#what-is-refused).

A layer of a vLLM plan's `kv_sharing` has no pages: its KV is its target's, which moves as the
target does. Both sides must then share alike; a layer that shares on one side only would be
left with pages nothing fills (or fill none it has), so the pair is refused naming it. An
SGLang plan shares nothing in its pools (SGLang allocates every layer's buffers)."""

from __future__ import annotations

from hisparse_plan.exchange.movable import sharing_difference
from hisparse_plan.exchange.transfer.errors import refuse_difference
from hisparse_plan.exchange.transfer.facts.side import Instance
from hisparse_plan.models import KVCachePlan


def _sharing(side: Instance) -> dict[str, str]:
    plan = side.plans[0]
    return dict(plan.kv_sharing) if isinstance(plan, KVCachePlan) else {}


def same_sharing(source: Instance, destination: Instance) -> None:
    """Each layer reads the same target's pages on both sides, or its own on both."""
    found = sharing_difference(_sharing(source), _sharing(destination))
    if found is not None:
        name, src, dst = found
        raise refuse_difference(
            name, "kv_sharing_target", src, dst,
            "a layer that reads another layer's pages on one side must read the same "
            "layer's on the other (its KV moves with its target's pages)",
        )
