"""Mamba and linear-attention states between tensor-parallel sizes (see
docs/transfer.md#states-across-tensor-parallel-sizes).

Each state of a layer is sharded along one axis of its per-rank shape (the conv state's
channels, the temporal state's heads); along that axis it may hold several blocks, each
sharded over the ranks on its own: a Mamba-2 conv state is x | B | C, a Gated DeltaNet or
KDA one q | k | v, so rank `r` of `n` holds channels `[r * g / n, (r + 1) * g / n)` of each
block `g` (vLLM 0.34's `derive_mamba_conv_split` and `MambaConvSplitInfo.remote_conv_offsets`,
SGLang 0.5.23's `compute_mamba_state_slice_blocks` with `conv_shard_groups`).

Across TP sizes a state layer's logical row is the state as one rank of TP 1 holds it: the
states back to back, each in its full shape. A rank holds pieces of that row: one per block
and per index of the axes before the sharded one, each a contiguous run of the rank's bytes
and of the row's. A destination rank's pieces come from the source ranks whose pieces
overlap them; a state the same on every rank is one piece, from one source rank. With equal
TP sizes nothing here applies: a state moves rank to rank."""

from __future__ import annotations

from dataclasses import dataclass, replace
from math import prod

from hisparse_plan.exchange.transfer.errors import TransferRefused, refuse_difference
from hisparse_plan.exchange.transfer.facts.rank_facts import FieldPlace, LayerFacts

Piece = tuple[int, int, int]
"""(byte in the rank's state, byte in the full state, bytes)."""


@dataclass(frozen=True, slots=True)
class StateSplit:
    """How one state of a layer is sharded: along `axis` of its per-rank shape, in `blocks`
    (their full extents along the axis, in order), each split evenly over the ranks; axis -1:
    the same on every rank."""

    axis: int
    blocks: tuple[int, ...]
    lo: int
    """Where the state starts in the layer's full logical row."""
    size: int
    """The full state's bytes."""


def state_splits(src: LayerFacts, dst: LayerFacts, src_ranks: int, dst_ranks: int,
                 groups: tuple[int, ...] | None) -> tuple[StateSplit, ...] | None:
    """Each state's split between the two TP sizes (None where they are equal: rank to
    rank); refused naming the layer and state where the shapes are not one state's shards,
    or the conv state's blocks (`groups`) are not known or do not divide."""
    if src_ranks == dst_ranks:
        return None
    splits: list[StateSplit] = []
    lo = 0
    for index, (ours, theirs) in enumerate(zip(src.fields, dst.fields, strict=True)):
        if ours.shape == theirs.shape:
            # The same on every rank (ZAYA1's CCA, vLLM's `is_kv_cache_tp_replicated`): one
            # source rank's copy, whole.
            splits.append(StateSplit(-1, (), lo, ours.size))
            lo += ours.size
            continue
        axis = sharded_axis(src.name, ours, theirs, src_ranks, dst_ranks)
        full = ours.shape[axis] * src_ranks
        blocks = state_blocks(src.name, ours.name, index, full, groups)
        for block in blocks:
            for ranks in (src_ranks, dst_ranks):
                if block % ranks:
                    raise TransferRefused(
                        f"layer {src.name!r}: {ours.name} block of {block} channels does not "
                        f"split over {ranks} ranks; expected each block a multiple of both "
                        f"TP sizes ({src_ranks}, {dst_ranks})",
                        layer=src.name, what="state_groups", field="state_groups",
                        source=src_ranks, destination=dst_ranks)
        size = ours.size * src_ranks
        splits.append(StateSplit(axis, blocks, lo, size))
        lo += size
    return tuple(splits)


def sharded_axis(layer: str, src: FieldPlace, dst: FieldPlace, src_ranks: int,
                 dst_ranks: int) -> int:
    """The one axis along which the two shapes are shards of one state: the same full
    extent, split over each side's ranks; every other axis equal."""
    if len(src.shape) != len(dst.shape):
        raise refuse_difference(layer, f"{src.name}.shape", list(src.shape),
                                list(dst.shape), "states of another shape are not one state")
    differ = [axis for axis, (a, b) in enumerate(zip(src.shape, dst.shape, strict=True))
              if a != b]
    if len(differ) != 1 or src.shape[differ[0]] * src_ranks != dst.shape[differ[0]] * dst_ranks:
        raise TransferRefused(
            f"layer {layer!r}: {src.name} is {list(src.shape)} on each of {src_ranks} source "
            f"ranks and {list(dst.shape)} on each of {dst_ranks} destination ranks; expected "
            "one axis sharded over the ranks to the same full extent and the others equal (a "
            "state replicated or padded per rank, such as Mamba-2's groups raised to the TP "
            "size, is not moved across TP sizes; see docs/transfer.md#what-is-refused)",
            layer=layer, what="tensor_parallel_size", field=f"layers[{layer!r}].{src.name}",
            source=src_ranks, destination=dst_ranks)
    return differ[0]


def state_blocks(layer: str, field: str, index: int, full: int,
                 groups: tuple[int, ...] | None) -> tuple[int, ...]:
    """The blocks along a state's sharded axis: the conv state (the first state, in both
    engines) is made of blocks sharded each on its own, which its shape does not tell, so
    the instances give them (`Instance.state_groups`); later states (temporal, recurrent)
    are sharded by heads, one block."""
    if index > 0:
        return (full,)
    if groups is None:
        raise TransferRefused(
            f"layer {layer!r}: its conv state ({field}) is moved between TP sizes, and its "
            "channel blocks are not known; expected Instance(state_groups=...) on either "
            "side: (intermediate,) for Mamba-1 or a short conv, (intermediate, groups * "
            "state, groups * state) for Mamba-2, (key, key, value) for Gated DeltaNet (see "
            "docs/transfer.md#states-across-tensor-parallel-sizes)",
            layer=layer, what="state_groups", field="state_groups")
    if sum(groups) != full:
        raise TransferRefused(
            f"layer {layer!r}: state_groups {list(groups)} add up to {sum(groups)} channels; "
            f"expected the conv state's {full}",
            layer=layer, what="state_groups", field="state_groups")
    return groups


def state_pieces(shape: tuple[int, ...], element: int, split: StateSplit, rank: int,
                 ranks: int) -> list[Piece]:
    """Rank `rank` of `ranks`'s pieces of one state: per index of the axes before the
    sharded one and per block, its share of the block (the rule of the module doc)."""
    axis = split.axis
    if axis < 0:
        return [(0, 0, prod(shape) * element)]
    outer = prod(shape[:axis])
    inner = prod(shape[axis + 1:]) * element
    local, full = shape[axis], sum(split.blocks)
    pieces: list[Piece] = []
    for row in range(outer):
        mine = theirs = 0
        for block in split.blocks:
            share = block // ranks
            pieces.append(((row * local + mine) * inner,
                           (row * full + theirs + rank * share) * inner, share * inner))
            mine += share
            theirs += block
    return pieces


def sliced(layer: LayerFacts, splits: tuple[StateSplit, ...], rank: int, ranks: int
           ) -> LayerFacts:
    """The layer of one rank with its fields cut into its pieces of the full logical row
    (their `lo` in the full row); one head, the same on every rank."""
    fields: list[FieldPlace] = []
    for field, split in zip(layer.fields, splits, strict=True):
        for mine, full, size in state_pieces(field.shape, element(field), split, rank,
                                             ranks):
            fields.append(replace(field, lo=split.lo + full, size=size, base=field.base + mine))
    return replace(layer, fields=tuple(fields))


def element(field: FieldPlace) -> int:
    """Bytes of one element of a state (its bytes over its shape's elements)."""
    return field.size // max(1, prod(field.shape))


def full_row(splits: tuple[StateSplit, ...]) -> int:
    """Bytes of the layer's full logical row."""
    return splits[-1].lo + splits[-1].size
