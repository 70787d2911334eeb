"""Decode context parallelism (DCP): which of a request's units one DCP rank holds, and where.

vLLM 0.34 (`vllm/v1/worker/gpu/block_table.py`, `_compute_slot_mappings_kernel`) shards a
DCP-sharded layer's tokens over the `size` ranks of a DCP group in runs of `interleave`
tokens (`cp_kv_cache_interleave_size`): token `p` lives on DCP rank `(p // I) % size`, at the
rank's own position `(p // (I * size)) * I + p % I`, in the block `position // block_size` of
the request's one block table (the scheduler's blocks hold `block_size * size` tokens,
`resolve_dcp_kv_block_size` in `vllm/v1/core/kv_cache_utils.py`; every rank of the group
reads the same ids). Here the arithmetic is in units (tokens, or index-key pages when the
interleave is a whole number of pages), so `interleave` is in units too."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ContextShard:
    """The units DCP rank `rank` of `size` holds: runs of `interleave` units, every
    `size * interleave` units, placed one after another on the rank."""

    size: int
    rank: int
    interleave: int

    @property
    def period(self) -> int:
        """Units after which the ranks' runs repeat."""
        return self.size * self.interleave

    def owner(self, unit: int) -> int:
        """The DCP rank that holds `unit`."""
        return unit // self.interleave % self.size

    def local(self, unit: int) -> int:
        """The rank's own position of `unit` (a unit it holds)."""
        return unit // self.period * self.interleave + unit % self.interleave

    def unit_at(self, local: int) -> int:
        """The request's unit at the rank's own position `local`."""
        return local // self.interleave * self.period + self.rank * self.interleave \
            + local % self.interleave

    def held(self, stop: int) -> int:
        """How many of units [0, stop) the rank holds: vLLM's per-rank sequence length
        (`_get_local_seq_lens`, `vllm/v1/worker/gpu/cp_utils.py`)."""
        rounds, rest = divmod(stop, self.period)
        return rounds * self.interleave + min(max(rest - self.rank * self.interleave, 0),
                                              self.interleave)

    def runs(self, lo: int, hi: int) -> list[tuple[int, int, int]]:
        """The rank's units in [lo, hi) as (first unit, length, count): `count` runs of
        `length` units, one `period` apart (a partial run at either end on its own)."""
        pieces: list[tuple[int, int]] = []
        start = lo // self.period * self.period + self.rank * self.interleave
        while start < hi:
            first, stop = max(start, lo), min(start + self.interleave, hi)
            if stop > first:
                pieces.append((first, stop - first))
            start += self.period
        found: list[tuple[int, int, int]] = []
        for first, length in pieces:
            if found:
                last, size, count = found[-1]
                if size == length and first == last + count * self.period:
                    found[-1] = (last, size, count + 1)
                    continue
            found.append((first, length, 1))
        return found
