"""A deployment's figures from one rank's plan: all its GPUs (tp x pp x dp ranks), all its host
pools, and the requests all its data-parallel ranks serve together.

One plan is one rank's. The TP ranks of a pipeline stage keep equal device pools (one plan
stage each); every DP rank repeats the whole set. With DP attention (how DeepSeek is served)
each DP rank runs its own requests in its own KV cache, so the node serves `dp x` what one DP
rank serves, and one DP rank serves what its pools hold, capped by vLLM's `max_num_seqs`. A
HiSparse host pool belongs to one DP rank when its TP ranks share it (or it has one TP rank);
an unshared pool is one per rank.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import Field

from hisparse_plan.errors import PlanError
from hisparse_plan.models import KVCachePlan
from hisparse_plan.models.base import ByteCount, Model, PositiveInt
from hisparse_plan.models.plan import Concurrency


@dataclass(frozen=True, slots=True)
class Ranks:
    """How a deployment splits over GPUs, as vLLM's -tp, -pp and -dp."""

    tp: int = 1
    pp: int = 1
    dp: int = 1

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp


def served_per_rank(pools_hold: float, max_num_seqs: int | None) -> float:
    """Concurrent requests one DP rank serves: what its pools hold, capped by max_num_seqs."""
    return pools_hold if max_num_seqs is None else min(pools_hold, float(max_num_seqs))


def served_node(pools_hold: float, dp: int, max_num_seqs: int | None) -> float:
    """Concurrent requests all `dp` DP ranks serve together."""
    return dp * served_per_rank(pools_hold, max_num_seqs)


def host_pools(plan: KVCachePlan, ranks: Ranks) -> int:
    """HiSparse host pools of the deployment: one per DP rank when shared by its TP ranks (or
    with one TP rank), else one per rank; none without HiSparse."""
    if plan.host_pool is None:
        return 0
    per_dp_rank = 1 if plan.host_pool.shared else ranks.tp
    return ranks.dp * per_dp_rank


class NodeFigures(Model):
    """What a whole deployment holds and serves, every rank counted."""

    gpus: PositiveInt = Field(description="tp x pp x dp.")
    tp: PositiveInt
    pp: PositiveInt
    dp: PositiveInt
    kv_cache_bytes: ByteCount = Field(
        description="Every GPU's device pools: each stage's pool x tp x dp."
    )
    host_pools: int = Field(ge=0, description="HiSparse host pools in host DRAM (see host_pools).")
    host_pool_bytes: ByteCount | None = Field(
        description="Host DRAM set aside for all the host pools (each pool's budget_bytes, "
        "which its mapping never passes); null without HiSparse."
    )
    per_dp_rank_concurrency: Concurrency = Field(
        description="Concurrent max_model_len requests one DP rank serves (capped by "
        "max_num_seqs)."
    )
    max_concurrency: Concurrency = Field(
        description="dp x per_dp_rank_concurrency: what the whole deployment serves."
    )


def node_figures(
    plan: KVCachePlan, ranks: Ranks, max_num_seqs: int | None = None
) -> NodeFigures:
    """`plan` (one rank's) counted over every rank of the deployment `ranks`."""
    if len(plan.device_pools) != ranks.pp:
        # The plan's stages are the deployment's pipeline stages; another count is two
        # different deployments.
        raise PlanError(
            f"ranks.pp: expected the plan's {len(plan.device_pools)} pipeline stage(s), got "
            f"{ranks.pp}",
            field="ranks.pp",
        )
    pools = host_pools(plan, ranks)
    per_rank = served_per_rank(plan.capacity.max_concurrency, max_num_seqs)
    return NodeFigures(
        gpus=ranks.gpus, tp=ranks.tp, pp=ranks.pp, dp=ranks.dp,
        kv_cache_bytes=sum(pool.size for pool in plan.device_pools) * ranks.tp * ranks.dp,
        host_pools=pools,
        host_pool_bytes=None if plan.host_pool is None else pools * plan.host_pool.budget_bytes,
        per_dp_rank_concurrency=per_rank,
        max_concurrency=ranks.dp * per_rank,
    )
