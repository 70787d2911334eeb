"""A layout fingerprint: one hash of everything that decides where a byte of the cache lives.

Two plans with the same fingerprint put every page of every layer at the same byte of the same
pool, with the same shape and dtype. The hash covers the groups (layer names, spec geometry),
the tensors (layers, strides, offsets, sizes), the pools' geometry and num_blocks, and nothing
else: capacity figures, warnings, the workload, budgets and other metadata may differ between
two plans of one layout.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Final

from hisparse_plan.models import (
    AttentionLayerSpec,
    GroupSpec,
    KVCachePlan,
    LayerSpec,
    UniformTypeSpec,
)

FINGERPRINT_VERSION: Final = 1
"""Part of the hashed text: a change to what is hashed changes every fingerprint."""


def _spec_geometry(spec: GroupSpec | LayerSpec) -> dict[str, Any]:
    """What of a spec shapes its pages: kind, tokens per page, page bytes, and for attention
    layers the heads, row bytes and dtype; a uniform_type group's member specs by name."""
    geometry: dict[str, Any] = {
        "kind": spec.kind,
        "block_size": spec.block_size,
        "page_size_bytes": spec.page_size_bytes,
    }
    if isinstance(spec, AttentionLayerSpec):
        geometry.update(
            num_kv_heads=spec.num_kv_heads, row_bytes=spec.content_bytes, dtype=spec.dtype
        )
    if isinstance(spec, UniformTypeSpec):
        geometry["specs"] = {name: _spec_geometry(member) for name, member in spec.specs.items()}
    return geometry


def layout_document(plan: KVCachePlan) -> dict[str, Any]:
    """The fingerprint's input as a JSON-ready dict (public plan fields only)."""
    host = plan.host_pool
    device = plan.device_pool
    return {
        "fingerprint_version": FINGERPRINT_VERSION,
        "num_blocks": plan.num_blocks,
        "groups": [
            {
                "layer_names": list(group.layer_names),
                "host_resident": group.host_resident,
                "spec": _spec_geometry(group.spec),
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
        "device_pool": {
            "layout": device.layout.value,
            "bytes_per_block": device.bytes_per_block,
            "size": device.size,
        },
    }


def canonical_json(document: object) -> str:
    """One spelling per value: sorted keys, no spaces, ASCII only (lists keep their order,
    which is significant: layer order is placement)."""
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def fingerprint(plan: KVCachePlan) -> str:
    """The sha256 (hex) of the plan's layout document in canonical JSON."""
    text = canonical_json(layout_document(plan))
    return hashlib.sha256(text.encode("ascii")).hexdigest()
