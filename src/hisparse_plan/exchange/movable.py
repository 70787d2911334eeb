"""What a transfer moves of a vLLM plan's layers, decided once: `transfer` (transfer/vllm_facts.py),
`manifest` and `diff` all read it here (see docs/transfer.md#what-is-refused).

A layer of a group whose pages HiSparse derives on the GPU (resident and hot copies, or a group
without `enable_kv_transfer`) is not transferred; a layer kept as a kind this version does not
move (a compressed or DeepSeek-V4 latent cache, cross-attention's encoder rows, a spec kind with
no K/V, latent, index or state rows) is refused by name; every other layer moves. A layer that
reads another layer's pages (cross-layer KV sharing) moves with its target's, and must read the
same target's on both sides."""

from __future__ import annotations

from collections.abc import Mapping

from hisparse_plan.models import (
    CrossAttentionSpec,
    GroupSpec,
    HisparseHotSpec,
    HisparseResidentSpec,
    KVCacheGroup,
    KVLayerSpec,
    LatentLayerSpec,
    MambaSpec,
    MLASpec,
    SlidingWindowMLASpec,
)


def group_transferred(group: KVCacheGroup) -> bool:
    """Whether a transfer moves the group's pages: not HiSparse's resident or hot copies, which
    it makes on the GPU from the source cache, and only where the plan enables transfer."""
    return group.enable_kv_transfer and not isinstance(
        group.spec, HisparseResidentSpec | HisparseHotSpec)


def unmovable_kind(spec: GroupSpec) -> str | None:
    """Why a transfer refuses a layer kept with `spec` (its own spec, not its group's), or
    None when its rows can move."""
    if isinstance(spec, MambaSpec):
        return None
    if isinstance(spec, SlidingWindowMLASpec) or (
        isinstance(spec, LatentLayerSpec)
        and (spec.compress_ratio != 1 or spec.model_version is not None)
    ):
        return "a compressed or DeepSeek-V4 latent cache"
    if isinstance(spec, MLASpec | LatentLayerSpec):
        return None
    if isinstance(spec, CrossAttentionSpec):
        # Its rows are the encoder's output, one table of their own sized by the encoder's
        # tokens, not the request's: the token ranges a transfer moves do not address them.
        return "a cross_attention layer (the encoder's keys and values)"
    if not isinstance(spec, KVLayerSpec):
        return f"a {spec.kind} layer"
    return None


def sharing_difference(
    source: Mapping[str, str], destination: Mapping[str, str],
) -> tuple[str, str | None, str | None] | None:
    """The first layer (source's sharing first) that reads another layer's pages on one side
    and not the same layer's on the other: (layer, its target on the source, on the
    destination); None when the two share alike."""
    for name in [*source, *destination]:
        if source.get(name) != destination.get(name):
            return name, source.get(name), destination.get(name)
    return None


__all__ = ["group_transferred", "sharing_difference", "unmovable_kind"]
