"""A decode instance's DCP ranks as facts (see docs/transfer.md#decode-context-parallelism):
each DCP-sharded layer of a vLLM plan gets its rank's `ContextShard`, and its table the
request's block size (`block_size * dcp`: what one of the scheduler's block ids stands for).
Whether a transfer may then move such a side is the program's rule (`match.context_ranks`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from hisparse_plan.exchange.transfer.errors import TransferRefused
from hisparse_plan.exchange.transfer.facts.context import ContextShard
from hisparse_plan.exchange.transfer.facts.rank_facts import LayerFacts, RankFacts
from hisparse_plan.models import KVCachePlan
from hisparse_plan.models.any_plan import Plan
from hisparse_plan.views import spec_of


def context_size(plan: Plan) -> tuple[int, str, bool]:
    """The plan's DCP size, the field that records it, and whether a transfer moves into its
    DCP ranks (vLLM's; SGLang 0.5.23 shards the latent rows over token ids `dcp_size` apart and
    keeps the index keys whole, and what its page ids then mean is not modelled here)."""
    if isinstance(plan, KVCachePlan):
        return plan.workload.decode_context_parallel_size, \
            "workload.decode_context_parallel_size", True
    return plan.budget.dcp_size, "budget.dcp_size", False


def context_sharded(plans: Sequence[Plan], facts: tuple[RankFacts, ...], interleave: int,
                    ) -> tuple[RankFacts, ...]:
    """The ranks' facts with each DCP-sharded layer's shard: a vLLM plan's rank `r` is DCP
    rank `r % dcp` (vLLM 0.34 `initialize_model_parallel`, `distributed/parallel_state.py`:
    a DCP group is `dcp` consecutive TP ranks). SGLang plans and plans without DCP are left
    as they are (a transfer refuses an SGLang DCP side)."""
    size = context_size(plans[0])[0]
    if size == 1 or not isinstance(plans[0], KVCachePlan):
        return facts
    if len(plans) % size:
        raise TransferRefused(
            f"decode_context_parallel_size: {len(plans)} tensor-parallel ranks do not form "
            f"groups of {size} DCP ranks; expected a multiple of {size} plans (vLLM: "
            "tensor_parallel_size divisible by decode_context_parallel_size)",
            what="decode_context_parallel_size", field="plans")
    found = []
    for rank, (plan, ours) in enumerate(zip(plans, facts, strict=True)):
        specs = spec_of(plan)  # type: ignore[arg-type]
        layers = dict(ours.layers)
        tables = set()
        for name, layer in ours.layers.items():
            if not getattr(specs[name][1], "dcp_sharded", False) or layer.kind == "state" \
                    or layer.unsupported is not None:
                continue
            layers[name] = shard_layer(layer, ContextShard(size, rank % size, 1), interleave)
            tables.add(layer.table)
        found.append(RankFacts(ours.engine, layers, {
            key: replace(table, block_tokens=table.block_tokens * size)
            if key in tables else table for key, table in ours.tables.items()}, ours.regions))
    return tuple(found)


def shard_layer(layer: LayerFacts, shard: ContextShard, interleave: int) -> LayerFacts:
    """The layer as DCP rank `shard.rank` holds it: runs of `interleave` tokens, in units
    (a whole number of index-key pages for a page layer, whose page layout is per page)."""
    tokens = layer.tokens_per_unit
    block = layer.units_per_block * tokens
    if interleave % tokens or block % interleave:
        raise TransferRefused(
            f"layer {layer.name!r}: cp_kv_cache_interleave_size is {interleave}; expected a "
            f"divisor of the block's {block} tokens and a multiple of the {tokens} tokens of "
            f"one of its {'index-key pages' if layer.kind == 'pages' else 'rows'} (a DCP rank "
            "holds runs of that many tokens; see docs/transfer.md#decode-context-parallelism)",
            layer=layer.name, what="cp_kv_cache_interleave_size", destination=interleave,
            field="cp_kv_cache_interleave_size")
    if layer.windowed or layer.chunk is not None:
        raise TransferRefused(
            f"layer {layer.name!r}: a sliding-window or chunked-local layer sharded by decode "
            f"context parallelism ({shard.size} ranks); expected 1 (vLLM refuses a window "
            "beside DCP; a window of a strided token set is not moved here)",
            layer=layer.name, what="decode_context_parallel_size", destination=shard.size,
            field="decode_context_parallel_size")
    return replace(layer, units_per_block=layer.units_per_block * shard.size,
                   shard=ContextShard(shard.size, shard.rank, interleave // tokens))
