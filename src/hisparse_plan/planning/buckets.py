"""Groups, and their layers bucketed by spec: each bucket becomes one tensor (SPEC 5.9)."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat
from operator import is_, itemgetter
from typing import NamedTuple

from hisparse_plan.models import (
    HisparseHotSpec,
    HisparseResidentSpec,
    KVCacheGroup,
    LayerSpec,
    UniformTypeSpec,
)

BucketSpec = LayerSpec | HisparseResidentSpec | HisparseHotSpec
"""A tensor's spec: one layer's own, never a uniform_type bundle."""


class SpecBucket(NamedTuple):
    """Layers of one group with the same spec, in model order."""

    spec: BucketSpec
    names: list[str]

    @property
    def block_bytes(self) -> int:
        """What one block of these layers takes."""
        return self.spec.page_size_bytes * len(self.names)


class PlacedGroup(NamedTuple):
    """A group with its spec buckets, worked out once and shared by every later step."""

    group: KVCacheGroup
    buckets: list[SpecBucket]

    @property
    def block_bytes(self) -> int:
        return sum(bucket.block_bytes for bucket in self.buckets)


def add_layer(buckets: list[SpecBucket], name: str, spec: LayerSpec) -> None:
    """Put a layer in the bucket of its spec, or open one: buckets keep first-appearance order."""
    # A validated request shares one object per distinct spec, so identity decides at once;
    # otherwise "the same spec" means every field equal.
    for bucket in reversed(buckets):
        if bucket.spec is spec:
            bucket.names.append(name)
            return
    for bucket in buckets:
        if bucket.spec.__dict__ == spec.__dict__:
            bucket.names.append(name)
            return
    buckets.append(SpecBucket(spec, [name]))


def bucket_layers(layers: Sequence[tuple[str, LayerSpec]]) -> list[SpecBucket]:
    """Bucket layers by spec; usually every layer shares one spec object, which is one pass."""
    first = layers[0][1]
    if all(map(is_, map(itemgetter(1), layers), repeat(first))):  # C-speed identity scan
        return [SpecBucket(first, [name for name, _ in layers])]
    buckets: list[SpecBucket] = []
    for name, spec in layers:
        add_layer(buckets, name, spec)
    return buckets


def place(group: KVCacheGroup) -> PlacedGroup:
    if not isinstance(group.spec, UniformTypeSpec):
        return PlacedGroup(group, [SpecBucket(group.spec, list(group.layer_names))])
    return PlacedGroup(group, bucket_layers(list(group.spec.specs.items())))


def uniform_spec(layers: dict[str, LayerSpec], buckets: list[SpecBucket]) -> UniformTypeSpec:
    """A uniform_type spec over validated members of one block size, without re-validating them."""
    return UniformTypeSpec.trusted(
        kind="uniform_type",
        block_size=buckets[0].spec.block_size,
        page_size_bytes=sum(bucket.block_bytes for bucket in buckets),
        specs=layers,
    )
