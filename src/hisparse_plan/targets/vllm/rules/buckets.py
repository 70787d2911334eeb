"""A group's layers by spec: the buckets that become its tensors (SPEC 5.9, 7.5)."""

from __future__ import annotations

from typing import NamedTuple

from hisparse_plan.models import (
    DerivedLayerSpec,
    GroupSpec,
    LayerSpec,
    UniformTypeSpec,
)

BucketSpec = LayerSpec | DerivedLayerSpec
"""A tensor's spec: one layer's own, never a uniform_type bundle."""


class SpecBucket(NamedTuple):
    """Layers with one spec, in model order."""

    spec: BucketSpec
    names: list[str]

    @property
    def block_bytes(self) -> int:
        """What one block of these layers takes."""
        return self.spec.page_size_bytes * len(self.names)


def spec_buckets(spec: GroupSpec, layer_names: list[str]) -> list[SpecBucket]:
    """A uniform_type group's members by spec, in order of first appearance; any other group is
    one bucket of its spec and all its layers."""
    if not isinstance(spec, UniformTypeSpec):
        return [SpecBucket(spec, list(layer_names))] if layer_names else []
    return buckets_of(spec.specs)


def buckets_of(specs: dict[str, LayerSpec]) -> list[SpecBucket]:
    """Layers by spec, in order of first appearance: identity first (a validated request shares
    one object per distinct spec), then equality of every field."""
    if len(set(map(id, specs.values()))) == 1:  # one shared object, the usual uniform group
        return [SpecBucket(next(iter(specs.values())), list(specs))]
    by_identity: dict[int, SpecBucket] = {}
    by_fields: dict[str, SpecBucket] = {}
    buckets: list[SpecBucket] = []
    for name, spec in specs.items():
        bucket = by_identity.get(id(spec))
        if bucket is None:
            key = spec.model_dump_json()
            bucket = by_fields.get(key)
            if bucket is None:
                bucket = by_fields[key] = SpecBucket(spec, [])
                buckets.append(bucket)
            by_identity[id(spec)] = bucket
        bucket.names.append(name)
    return buckets


def stage_buckets(spec: GroupSpec, layer_names: list[str], stage: set[str]) -> list[SpecBucket]:
    """A group's buckets projected onto one pipeline stage's layers (SPEC 7.6 step 2): a
    uniform_type group keeps the stage's members, by spec in their own order of first
    appearance; any other group keeps the stage's layers. Empty when the stage holds none."""
    if isinstance(spec, UniformTypeSpec):
        return buckets_of({name: member for name, member in spec.specs.items() if name in stage})
    kept = [name for name in layer_names if name in stage]
    return [SpecBucket(spec, kept)] if kept else []
