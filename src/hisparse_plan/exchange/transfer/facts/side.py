"""One instance of a transfer: its plans, one per tensor-parallel rank, read as facts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType

from hisparse_plan.errors import PlanError
from hisparse_plan.exchange.transfer.facts.dcp import context_sharded
from hisparse_plan.exchange.transfer.facts.engines import reading
from hisparse_plan.exchange.transfer.facts.rank_facts import RankFacts, TableFacts
from hisparse_plan.models.any_plan import Plan

FP8_FORMATS: Mapping[str, str] = MappingProxyType({
    "fp8": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2",
    "auto": "auto", "bfloat16": "auto", "float16": "auto",
})
"""A `--kv-cache-dtype` name -> the element format an fp8 cache's uint8 rows hold (`auto` and
the float types store their own dtype, which the plan names)."""


def rank_facts(plan: Plan) -> RankFacts:
    """What a transfer reads from one rank's plan, whichever engine's."""
    return reading(plan).facts(plan)


@dataclass(frozen=True)
class Instance:
    """A prefill or decode instance: one plan per tensor-parallel rank, in rank order.

    `total_kv_heads` is the model's KV heads of its attention layers (rank `r` holds heads
    `[r * h, (r + 1) * h)` of them, or one replicated head when there are fewer heads than
    ranks); None: each rank's heads times the ranks. `windows` gives the window of
    sliding-window layers whose plan does not record it (SGLang's swa pool). `cache_dtype` is
    the engine's `--kv-cache-dtype` (`fp8_e4m3`, `fp8_e5m2`; vLLM's `fp8` is `fp8_e4m3`): both
    engines store an fp8 cache as uint8, so a plan cannot say which fp8 its rows hold, and a
    transfer of such rows needs each side to say it. `state_groups` gives a Mamba or
    linear-attention conv state's channel blocks, each sharded over the ranks on its own
    (SGLang's `conv_shard_groups`: Mamba-2's x, B, C; Gated DeltaNet's q, k, v), full sizes in
    channels; a conv state moved between TP sizes needs it on either side.
    `cp_kv_cache_interleave_size` is vLLM's (`--cp-kv-cache-interleave-size`, 1 unless set;
    vLLM sets it to the block size for a NixlConnector P/D pair): tokens a DCP rank holds in
    a row, for a decode with decode context parallelism (its plans record the DCP size, not
    the interleave)."""

    plans: Sequence[Plan]
    total_kv_heads: int | None = None
    windows: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    cache_dtype: str | None = None
    state_groups: tuple[int, ...] | None = None
    cp_kv_cache_interleave_size: int = 1

    def __post_init__(self) -> None:
        if not self.plans:
            raise PlanError("plans: expected one plan per tensor-parallel rank, got none",
                            field="plans")
        if self.cache_dtype is not None and self.cache_dtype not in FP8_FORMATS:
            raise PlanError(
                f"cache_dtype: expected one of {sorted(FP8_FORMATS)} (the engine's "
                f"--kv-cache-dtype) or null, got {self.cache_dtype!r}", field="cache_dtype")
        if self.state_groups is not None and (
                not self.state_groups or min(self.state_groups) < 1):
            raise PlanError(f"state_groups: expected positive channel counts, got "
                            f"{list(self.state_groups)}", field="state_groups")
        if self.cp_kv_cache_interleave_size < 1:
            raise PlanError(f"cp_kv_cache_interleave_size: expected a positive token count, "
                            f"got {self.cp_kv_cache_interleave_size}",
                            field="cp_kv_cache_interleave_size")
        engines = {plan.engine for plan in self.plans}
        if len(engines) > 1:
            raise PlanError(f"plans: expected one engine's plans, got {sorted(engines)}",
                            field="plans")

    @property
    def ranks(self) -> int:
        return len(self.plans)

    @property
    def engine(self) -> str:
        return self.plans[0].engine

    @cached_property
    def facts(self) -> tuple[RankFacts, ...]:
        return context_sharded(self.plans, tuple(rank_facts(plan) for plan in self.plans),
                               self.cp_kv_cache_interleave_size)

    @cached_property
    def holders(self) -> Mapping[str, tuple[int, ...]]:
        """Each layer's ranks, in rank order: every rank, or with SGLang's pipeline ranks
        (each plans its stage's layers) the ranks of the layer's stage, its tensor-parallel
        group. A vLLM plan holds every stage (a device pool each): one stage per instance."""
        found: dict[str, list[int]] = {}
        for rank, facts in enumerate(self.facts):
            for name in facts.layers:
                found.setdefault(name, []).append(rank)
        return MappingProxyType({name: tuple(ranks) for name, ranks in found.items()})

    def group(self, layer: str) -> tuple[int, ...]:
        """The ranks that hold `layer` (its stage's tensor-parallel group)."""
        return self.holders[layer]

    def tp_rank(self, layer: str, rank: int) -> tuple[int, int]:
        """(rank's place in the layer's tensor-parallel group, the group's size)."""
        group = self.holders[layer]
        return group.index(rank), len(group)

    @cached_property
    def tables(self) -> Mapping[str, TableFacts]:
        """The instance's block tables: a request's ids of a table are the same on every
        stage that holds it (SGLang's pipeline ranks share token ids), so an id must be a
        block of every stage's pool: the fewest blocks, the most padding blocks."""
        found: dict[str, TableFacts] = {}
        for facts in self.facts:
            for key, table in facts.tables.items():
                known = found.get(key)
                if known is None:
                    found[key] = table
                    continue
                if (known.block_tokens, known.state) != (table.block_tokens, table.state):
                    raise PlanError(
                        f"table {key!r}: the ranks' plans give it {known.block_tokens} and "
                        f"{table.block_tokens} tokens a block; expected one block size per "
                        "table", field="plans")
                found[key] = TableFacts(key, known.block_tokens,
                                        min(known.num_blocks, table.num_blocks),
                                        max(known.padding_blocks, table.padding_blocks),
                                        known.state)
        return MappingProxyType(found)


def as_instance(side: Instance | Plan | Sequence[Plan]) -> Instance:
    """An Instance from itself, one plan (one rank), or a rank-ordered list of plans."""
    if isinstance(side, Instance):
        return side
    if isinstance(side, Sequence):
        return Instance(tuple(side))
    return Instance((side,))
