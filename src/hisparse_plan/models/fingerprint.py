"""A layout fingerprint: one hash of everything that decides where a byte of the cache lives.

Two plans with the same fingerprint put every page of every layer at the same byte of the same
pool, with the same shape and dtype. The hash covers the groups (layer names, pool, specs), the
tensors (layers, strides, offsets, sizes), the pools' geometry (each pipeline stage's device
pool with its layers) and num_blocks, and nothing else: capacity figures, warnings, the
workload, budgets, roles and other metadata may differ between two plans of one layout.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any, Final, Protocol

from hisparse_plan.models.group_specs import GroupSpec, UniformTypeSpec
from hisparse_plan.models.layer_specs import LayerSpec
from hisparse_plan.models.layout import KVCacheLayout
from hisparse_plan.models.tensors import KVCacheTensor

FINGERPRINT_VERSION: Final = 1
"""Part of the hashed text: a change to what is hashed changes every fingerprint."""


# What the hash reads of a plan, as protocols: `KVCachePlan.fingerprint` (models/plan.py) calls
# this module, so naming the plan's classes here would make the two modules import each other.
class _Group(Protocol):
    @property
    def layer_names(self) -> Sequence[str]: ...
    @property
    def host_resident(self) -> bool: ...
    @property
    def spec(self) -> GroupSpec: ...


class _HostPool(Protocol):
    @property
    def num_blocks(self) -> int: ...
    @property
    def block_stride(self) -> int: ...
    @property
    def bytes_per_block(self) -> int: ...
    @property
    def shared(self) -> bool: ...
    @property
    def layout(self) -> KVCacheLayout: ...


class _DevicePool(Protocol):
    @property
    def layout(self) -> KVCacheLayout: ...
    @property
    def bytes_per_block(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def layers(self) -> Sequence[str] | None: ...


class LaidOutPlan(Protocol):
    """The fields of a plan (`KVCachePlan`) that decide where its bytes live."""

    @property
    def num_blocks(self) -> int: ...
    @property
    def groups(self) -> Sequence[_Group]: ...
    @property
    def tensors(self) -> Sequence[KVCacheTensor]: ...
    @property
    def host_pool(self) -> _HostPool | None: ...
    @property
    def device_pools(self) -> Sequence[_DevicePool]: ...
    @property
    def kv_sharing(self) -> Mapping[str, str]: ...


def _spec_document(spec: GroupSpec | LayerSpec) -> dict[str, Any]:
    """A spec whole, with its kind (a uniform_type group's with its member specs): its fields
    shape the pages. Left out: other fields at their defaults, so that a field a later version
    adds does not change the fingerprint of plans that leave it alone; and a hot group's
    blocks_per_request, a count per request that places no byte."""
    document = {"kind": spec.kind, **spec.model_dump(mode="json", exclude_defaults=True)}
    document.pop("blocks_per_request", None)
    if isinstance(spec, UniformTypeSpec):
        document["specs"] = {name: _spec_document(member) for name, member in spec.specs.items()}
    return document


def layout_document(plan: LaidOutPlan) -> dict[str, Any]:
    """The fingerprint's input as a JSON-ready dict (public plan fields only). Cross-layer KV
    sharing (whose pages a layer reads) is hashed only when the plan has some, so that the
    fingerprints of plans without it stay as they were."""
    document = _layout_document(plan)
    if plan.kv_sharing:
        document["kv_sharing"] = dict(plan.kv_sharing)
    return document


def _layout_document(plan: LaidOutPlan) -> dict[str, Any]:
    host = plan.host_pool
    return {
        "fingerprint_version": FINGERPRINT_VERSION,
        "num_blocks": plan.num_blocks,
        "groups": [
            {
                "layer_names": list(group.layer_names),
                "host_resident": group.host_resident,
                "spec": _spec_document(group.spec),
            }
            for group in plan.groups
        ],
        "tensors": [
            {
                "layers": list(tensor.layers),
                "host_resident": tensor.host_resident,
                "offset": tensor.offset,
                "layer_stride": tensor.layer_stride,
                "block_stride": tensor.block_stride,
                "size": tensor.size,
            }
            for tensor in plan.tensors
        ],
        "host_pool": None if host is None else {
            "num_blocks": host.num_blocks,
            "block_stride": host.block_stride,
            "bytes_per_block": host.bytes_per_block,
            "shared": host.shared,
            "layout": host.layout.value,
        },
        "device_pools": [
            {
                "layout": device.layout.value,
                "bytes_per_block": device.bytes_per_block,
                "size": device.size,
                "layers": None if device.layers is None else list(device.layers),
            }
            for device in plan.device_pools
        ],
    }


def canonical_json(document: object) -> str:
    """One spelling per value: sorted keys, no spaces, ASCII only (lists keep their order,
    which is significant: layer order is placement)."""
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def fingerprint(plan: LaidOutPlan) -> str:
    """The sha256 (hex) of the plan's layout document in canonical JSON."""
    text = canonical_json(layout_document(plan))
    return hashlib.sha256(text.encode("ascii")).hexdigest()
