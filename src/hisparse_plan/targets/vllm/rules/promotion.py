"""Local-attention layers given full allocation (SPEC 7.3.3 and 7.13): the layer keeps a block
for every token, so it is planned as full attention (`mla` for a sliding_window_mla layer) that
remembers its window or chunk, as vLLM's promoted specs do."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TypeGuard

from hisparse_plan.models import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    LayerSpec,
    MLASpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
)
from hisparse_plan.models.base import built_for

LocalSpec = SlidingWindowSpec | SlidingWindowMLASpec | ChunkedLocalAttentionSpec
FullSpec = FullAttentionSpec | MLASpec


def is_local(spec: LayerSpec) -> TypeGuard[LocalSpec]:
    return isinstance(spec, SlidingWindowSpec | SlidingWindowMLASpec | ChunkedLocalAttentionSpec)


def full_block_size(specs: Iterable[LayerSpec]) -> int | None:
    """The block size of the full-attention and mla layers when they share exactly one."""
    sizes = {spec.block_size for spec in specs if isinstance(spec, FullAttentionSpec | MLASpec)}
    return next(iter(sizes)) if len(sizes) == 1 else None


def promote(spec: LocalSpec, block_size: int | None) -> FullSpec:
    """`spec` with full allocation at `block_size` (None: its own). An explicit padded page is
    kept, raised to the natural page at the new block size; the extra window tokens of a
    drafter no longer matter (every token keeps its block)."""
    fields = {
        key: value for key, value in spec.__dict__.items()
        if key not in ("kind", "page_size_bytes")
    }
    new_block = spec.block_size if block_size is None else block_size
    fields["block_size"] = new_block
    if spec.page_size_padded is not None:
        scaled_natural = spec.natural_page_bytes * new_block // spec.block_size
        fields["page_size_padded"] = max(spec.page_size_padded, scaled_natural)
    if isinstance(spec, SlidingWindowMLASpec):
        return MLASpec.model_validate(fields)
    return FullAttentionSpec.model_validate(fields)


def promote_local_layers(
    layers: Sequence[tuple[str, LayerSpec]],
) -> tuple[list[tuple[str, LayerSpec]], int]:
    """`layers` (request order) with every local-attention layer promoted, at the block size of
    the full-attention and mla layers when they share one; each spec object is promoted once.
    Also the number of layers promoted."""
    block_size = full_block_size(spec for _, spec in layers)
    made: dict[int, LayerSpec] = {}
    result: list[tuple[str, LayerSpec]] = []
    count = 0
    for name, spec in layers:
        if is_local(spec):
            new = made.get(id(spec))
            if new is None:
                with built_for(f"layers[{name!r}]", "its full-attention promotion"):
                    new = made[id(spec)] = promote(spec, block_size)
            result.append((name, new))
            count += 1
        else:
            result.append((name, spec))
    return result, count
