"""Layers by spec: runs in model order, and the buckets that become tensors (SPEC 5.9)."""

from __future__ import annotations

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


class LayerRun(NamedTuple):
    """Consecutive layers of one role that share one spec object, in model order."""

    spec: LayerSpec
    names: list[str]


class SpecBucket(NamedTuple):
    """Layers with the same spec (consecutive ones, or all of a group's), in model order."""

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


def merge_runs(runs: list[LayerRun]) -> list[SpecBucket]:
    """Buckets from runs: runs of the same spec join, in order of first appearance.

    A validated request shares one object per distinct spec, so identity usually decides;
    otherwise "the same spec" means every field equal.
    """
    buckets: list[SpecBucket] = []
    for spec, names in runs:
        bucket = next((b for b in buckets if b.spec is spec), None) or next(
            (b for b in buckets if b.spec.__dict__ == spec.__dict__), None
        )
        if bucket is None:
            buckets.append(SpecBucket(spec, list(names)))
        else:
            bucket.names.extend(names)
    return buckets


def place(group: KVCacheGroup) -> PlacedGroup:
    if not isinstance(group.spec, UniformTypeSpec):
        return PlacedGroup(group, [SpecBucket(group.spec, list(group.layer_names))])
    runs = [LayerRun(spec, [name]) for name, spec in group.spec.specs.items()]
    return PlacedGroup(group, merge_runs(runs))


def members(runs: list[LayerRun]) -> dict[str, LayerSpec]:
    """Layer name -> spec, in model order."""
    specs: dict[str, LayerSpec] = {}
    for spec, names in runs:
        specs.update(dict.fromkeys(names, spec))
    return specs


def uniform_spec(layers: dict[str, LayerSpec], buckets: list[SpecBucket]) -> UniformTypeSpec:
    """A uniform_type spec over validated members of one block size, without re-validating them."""
    return UniformTypeSpec.trusted({
        "kind": "uniform_type",
        "block_size": buckets[0].spec.block_size,
        "page_size_bytes": sum(bucket.block_bytes for bucket in buckets),
        "specs": layers,
    })
