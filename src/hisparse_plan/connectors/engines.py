"""The connectors' one table of engines (docs/architecture.md#where-engine-names-may-appear):
what differs by engine in the engine-neutral parts (`protocol`, `peering`)."""

from __future__ import annotations

import hashlib

from hisparse_plan.models.any_plan import Plan
from hisparse_plan.models.fingerprint import canonical_json


def plan_fingerprint(plan: Plan) -> str:
    """A vLLM plan's layout fingerprint (`KVCachePlan.fingerprint`: everything that places a
    byte, num_blocks included); an SGLang plan, which has none, the sha256 of its canonical
    JSON. Two ranks with one fingerprint pair with a peer through one proved pattern."""
    if plan.engine == "vllm":
        return str(plan.fingerprint)
    text = canonical_json(plan.model_dump(mode="json"))
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def transfer_rank(engine: str, pp_rank: int, tp_rank: int, tp_size: int) -> int:
    """The rank a pattern names for a worker's regions: a vLLM instance's tensor-parallel
    rank (its plan holds every pipeline stage), an SGLang instance's `pp * tp + tp` (one plan
    per pipeline rank)."""
    if engine == "vllm":
        return tp_rank
    return pp_rank * tp_size + tp_rank
