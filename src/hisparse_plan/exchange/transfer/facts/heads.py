"""Tensor parallelism: which global KV heads each rank holds, and which source rank serves
each head a destination rank needs (see docs/transfer.md#tensor-parallelism)."""

from __future__ import annotations

from hisparse_plan.exchange.transfer.errors import TransferRefused
from hisparse_plan.exchange.transfer.facts.rank_facts import LayerFacts


def head_start(layer: LayerFacts, rank: int, ranks: int, total: int | None) -> int:
    """The first global head `rank` of `ranks` holds of `layer` (vLLM's and SGLang's split):
    replicated rows hold every head on every rank; a state is its rank's own shard; with at
    least one head per rank the heads split evenly in rank order; with fewer heads than ranks
    each head is replicated on ranks // heads consecutive ranks."""
    if layer.replicated:
        return 0
    if layer.kind == "state":
        return rank
    total = layer.heads * ranks if total is None else total
    if total >= ranks:
        if total != layer.heads * ranks:
            raise TransferRefused(
                f"layer {layer.name!r}: {ranks} ranks of {layer.heads} KV heads hold "
                f"{layer.heads * ranks} heads; expected total_kv_heads {total} (see "
                "docs/transfer.md#tensor-parallelism)",
                layer=layer.name, what="num_kv_heads", field="total_kv_heads",
            )
        return rank * layer.heads
    if ranks % total or layer.heads != 1:
        raise TransferRefused(
            f"layer {layer.name!r}: {total} KV heads over {ranks} ranks: expected one head per "
            f"rank and ranks a multiple of the heads, got {layer.heads} heads per rank (see "
            "docs/transfer.md#tensor-parallelism)",
            layer=layer.name, what="num_kv_heads", field="total_kv_heads",
        )
    return rank // (ranks // total)


def global_heads(layer: LayerFacts, ranks: int, total: int | None) -> int:
    """The heads all ranks hold together (a replicated layer's own; a state's, one per rank)."""
    if layer.replicated:
        return layer.heads
    if layer.kind == "state":
        return ranks
    return layer.heads * ranks if total is None else total


def serving_ranks(
    starts: list[int], heads: int, want: tuple[int, int], destination_rank: int
) -> list[tuple[int, int, int]]:
    """Source ranks for the global heads `want` = [first, stop) of one destination rank:
    (source rank, first, stop) in head order. Where several source ranks hold a head
    (replicated rows, or fewer heads than ranks) the destination rank's index picks one, so
    the destination ranks spread their reads over the source ranks."""
    served: list[tuple[int, int, int]] = []
    for head in range(*want):
        holders = [rank for rank, start in enumerate(starts) if start <= head < start + heads]
        if not holders:
            return []
        rank = holders[destination_rank % len(holders)]
        if served and served[-1][0] == rank and served[-1][2] == head:
            served[-1] = (rank, served[-1][1], head + 1)
        else:
            served.append((rank, head, head + 1))
    return served
