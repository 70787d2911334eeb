"""Kind families: which layers may share one uniform_type group (SPEC 7.2)."""

from __future__ import annotations

from hisparse_plan.models import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    LayerSpec,
    MambaSpec,
    MLASpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
)

FamilyKey = tuple[object, ...]


def joins_family(first: LayerSpec, spec: LayerSpec) -> bool:
    """Whether `spec` belongs to the family that `first` (the set's first layer) leads.

    Asymmetric, as vLLM's rule is: a sliding_window_mla layer may join a set led by a
    sliding_window layer, not the other way round. A family also shares one DCP sharding.
    """
    if spec.block_size != first.block_size or dcp_sharded(spec) != dcp_sharded(first):
        return False
    if isinstance(first, FullAttentionSpec | MLASpec):
        return isinstance(spec, FullAttentionSpec | MLASpec)
    if isinstance(first, SlidingWindowSpec):
        return (
            isinstance(spec, SlidingWindowSpec | SlidingWindowMLASpec)
            and spec.sliding_window == first.sliding_window
        )
    if isinstance(first, SlidingWindowMLASpec):
        return (
            isinstance(spec, SlidingWindowMLASpec)
            and spec.sliding_window == first.sliding_window
        )
    if isinstance(first, ChunkedLocalAttentionSpec):
        return (
            isinstance(spec, ChunkedLocalAttentionSpec)
            and spec.attention_chunk_size == first.attention_chunk_size
        )
    if isinstance(first, CrossAttentionSpec):
        # vLLM registers CrossAttentionSpec as its own uniform-type base (its
        # CrossAttentionManager): cross-attention layers never share a group with the decoder's
        # self-attention layers.
        return isinstance(spec, CrossAttentionSpec)
    return isinstance(spec, MambaSpec) and _mamba_family(spec) == _mamba_family(first)


def dcp_sharded(spec: LayerSpec) -> bool:
    """Whether decode context parallelism shards the layer's tokens (Mamba states never)."""
    return not isinstance(spec, MambaSpec) and spec.dcp_sharded


def _mamba_family(spec: MambaSpec) -> tuple[object, ...]:
    return (
        spec.num_speculative_blocks, spec.num_prefill_checkpoint_blocks,
        spec.prefill_checkpoint_alignment, spec.page_size_bytes, spec.state_alignment,
    )


def one_family(specs: list[LayerSpec]) -> bool:
    """All of `specs` (in request order) are of one family, judged by the first."""
    first = specs[0]
    return all(joins_family(first, spec) for spec in specs)


def family_key(first: LayerSpec) -> FamilyKey:
    """What a set led by `first` accepts, as a key: two leaders with one key accept the same
    layers, so the first set of each key is the only one a layer can join."""
    sharded = dcp_sharded(first)
    if isinstance(first, FullAttentionSpec | MLASpec):
        return ("full", first.block_size, sharded)
    if isinstance(first, SlidingWindowSpec):
        return ("sliding", first.block_size, sharded, first.sliding_window)
    if isinstance(first, SlidingWindowMLASpec):
        return ("sliding_mla", first.block_size, sharded, first.sliding_window)
    if isinstance(first, ChunkedLocalAttentionSpec):
        return ("chunked", first.block_size, sharded, first.attention_chunk_size)
    if isinstance(first, CrossAttentionSpec):
        return ("cross", first.block_size, sharded)
    return ("mamba", first.block_size, *_mamba_family(first))


def keys_joined_by(spec: LayerSpec) -> tuple[FamilyKey, ...]:
    """The keys of every kind of set `spec` may join (the inverse of `joins_family`)."""
    if isinstance(spec, SlidingWindowMLASpec):
        return (
            ("sliding", spec.block_size, spec.dcp_sharded, spec.sliding_window),
            ("sliding_mla", spec.block_size, spec.dcp_sharded, spec.sliding_window),
        )
    return (family_key(spec),)
