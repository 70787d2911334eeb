"""The block tables a request gives blocks in, per plan (what TransferRequest keys by)."""

from __future__ import annotations

from hisparse_plan.exchange.transfer.facts.rank_facts import TableFacts
from hisparse_plan.exchange.transfer.facts.side import rank_facts
from hisparse_plan.models.any_plan import Plan


def tables(plan: Plan) -> dict[str, TableFacts]:
    """Each table a transfer reads blocks from: vLLM's transferred groups (`group.K`), SGLang's
    `full`, `swa`, `mamba` and `hisparse_host` id spaces; with tokens per block, the blocks
    and padding blocks of its pools, and whether it holds states."""
    return dict(rank_facts(plan).tables)
