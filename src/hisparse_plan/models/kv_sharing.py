"""Cross-layer KV sharing in a request (see docs/plan-contract.md#cross-layer-kv-sharing).

A layer whose spec names `kv_sharing_target` reads that layer's cache and keeps none of its own
(vLLM's `kv_sharing_target_layer_name`, Gemma-3n's last `num_kv_shared_layers`). The target
must be a layer of the request that keeps its own cache, with the very geometry of the sharing
layer: the sharing layer's attention reads the target's pages as its own, so any field that
shapes a page (kind, heads, head sizes, dtype, block, window) must agree.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from hisparse_plan.models.layer_specs import LayerSpec

SHARING_FIELD: Final = "kv_sharing_target"


def sharing_target(spec: object) -> str | None:
    """The layer whose cache `spec`'s layer reads, or None (a kind that cannot share has none)."""
    target = getattr(spec, SHARING_FIELD, None)
    return target if isinstance(target, str) else None


def shared_layers(layers: Mapping[str, LayerSpec]) -> dict[str, str]:
    """Sharing layer -> the layer whose cache it reads, in request order."""
    distinct = {id(spec): spec for spec in layers.values()}
    if not any(sharing_target(spec) for spec in distinct.values()):
        return {}  # the usual request: one look per distinct spec
    return {name: target for name, spec in layers.items()
            if (target := sharing_target(spec)) is not None}


def geometry(spec: object) -> dict[str, object]:
    """Every field of a spec but the sharing declaration: what two layers reading one cache
    must agree on."""
    return {key: value for key, value in vars(spec).items() if key != SHARING_FIELD}


def check_sharing_targets(layers: Mapping[str, LayerSpec]) -> None:
    """Each declared target is a request layer that keeps its own cache, with the sharing
    layer's geometry; ValueError naming the sharing layer otherwise."""
    for name, target in shared_layers(layers).items():
        where = f"layers[{name!r}].{SHARING_FIELD}"
        found = layers.get(target)
        if target == name:
            raise ValueError(f"{where}: a layer cannot read its own cache; expected another "
                             "layer's name or null")
        if found is None:
            raise ValueError(f"{where}: expected a layer of the request, got {target!r}")
        further = sharing_target(found)
        if further is not None:
            raise ValueError(
                f"{where}: {target!r} itself reads {further!r}'s cache; expected a layer that "
                f"keeps its own (name {further!r})"
            )
        mine, theirs = geometry(layers[name]), geometry(found)
        if type(found) is not type(layers[name]) or mine != theirs:
            field = next((key for key in mine if mine[key] != theirs.get(key)), "kind")
            raise ValueError(
                f"{where}: {target!r} has {field} {theirs.get(field)!r}, this layer "
                f"{mine.get(field)!r}; expected the target's geometry (a shared layer reads the "
                "target's pages as its own)"
            )
