"""Groups as the planner carries them: the contract's group and its spec buckets."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hisparse_plan.models import (
    GroupRole,
    GroupSpec,
    KVCacheGroup,
    LayerSpec,
    UniformTypeSpec,
)
from hisparse_plan.models.base import built_for
from hisparse_plan.targets.vllm.rules.buckets import SpecBucket, buckets_of, spec_buckets

Layer = tuple[str, LayerSpec]
"""A layer name and its spec, in request order."""


@dataclass(frozen=True, slots=True)
class PlannedGroup:
    """A group with its spec buckets, worked out once and shared by every later stage."""

    group: KVCacheGroup
    buckets: list[SpecBucket]

    @property
    def block_bytes(self) -> int:
        return sum(bucket.block_bytes for bucket in self.buckets)


def first_of_each_spec(layers: Sequence[Layer]) -> list[Layer]:
    """The first layer of each distinct spec object, in request order."""
    specs = [spec for _, spec in layers]
    # Walking backwards leaves each spec's earliest layer in the map.
    earliest = dict(zip(map(id, reversed(specs)), reversed(layers), strict=True))
    return [earliest[key] for key in dict.fromkeys(map(id, specs))]


def single_spec_group(
    spec: GroupSpec, names: list[str], role: GroupRole = "default"
) -> PlannedGroup:
    """A group whose layers share one spec (its kind is the spec's kind)."""
    group = KVCacheGroup(
        layer_names=names,
        spec=spec,
        role=role,
        host_resident=role == "hisparse_source",
        enable_kv_transfer=role != "default" or not _derived(spec),
    )
    return PlannedGroup(group, spec_buckets(spec, names))


def uniform_group(layers: Sequence[Layer], role: GroupRole = "default") -> PlannedGroup:
    """A uniform_type group over `layers` (one family and block size), in the order given."""
    specs = dict(layers)
    with built_for(f"layers[{layers[0][0]!r}]", "the uniform_type group it starts"):
        spec = UniformTypeSpec(block_size=layers[0][1].block_size, specs=specs)
    group = KVCacheGroup(
        layer_names=list(specs),
        spec=spec,
        role=role,
        host_resident=role == "hisparse_source",
        enable_kv_transfer=True,
    )
    return PlannedGroup(group, buckets_of(specs))


def _derived(spec: GroupSpec) -> bool:
    return spec.kind in ("hisparse_resident", "hisparse_hot")
