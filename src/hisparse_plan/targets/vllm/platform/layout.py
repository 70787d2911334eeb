"""The KV-cache layout vLLM 0.34 resolves from its backends' declared sets (vllm/v1/attention/
backends/utils.py `get_supported_kv_cache_layouts`, `resolve_kv_cache_layout`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from hisparse_plan.errors import UnsupportedRequestError
from hisparse_plan.models.layout import KVCacheLayout
from hisparse_plan.targets.vllm.platform.backends import DEFAULT_PREFERENCE, LayoutSet

ENUM_ORDER = ("LBNHC", "LBHNC", "LHBNC", "BLHNC", "BLNHC", "BHLNC")
"""vLLM's `KVCacheLayout` members in definition order (vllm/v1/kv_cache_layout.py), the
tie-break of a merge."""
HISPARSE_CONNECTOR_LAYOUT = KVCacheLayout.BLHNC
"""`HiSparseConnector.get_required_kvcache_layout` (vllm/distributed/kv_transfer/kv_connector/
v1/hisparse/connector.py)."""


@dataclass(frozen=True, slots=True)
class LayoutResolution:
    layout: KVCacheLayout
    candidates: tuple[str, ...]
    """The layouts vLLM would accept, most preferred first."""
    why: str


def merge_layouts(declared: Sequence[LayoutSet]) -> list[str]:
    """Layouts in every declared set, most preferred first (utils.py
    `_merge_supported_layouts`): identical sets keep their order; else the layouts in all of
    them, by how many sets put each first, ties in enum order. None declared: vLLM's default
    preference. An empty intersection is refused."""
    sets = list(declared) or [DEFAULT_PREFERENCE]
    first = sets[0]
    if all(layouts == first for layouts in sets[1:]):
        return list(first)
    votes = Counter(layouts[0] for layouts in sets)
    common = set.intersection(*(set(layouts) for layouts in sets))
    candidates = sorted((name for name in ENUM_ORDER if name in common),
                        key=lambda name: votes[name], reverse=True)
    if not candidates:
        raise UnsupportedRequestError(
            f"no KV cache layout satisfies every supported set: {[list(s) for s in sets]} "
            "(vllm/v1/attention/backends/utils.py)")
    return candidates


def resolve_layout(
    declared: Sequence[LayoutSet], *, mixed_shapes: bool, hisparse: bool, extensible: bool,
    requested: KVCacheLayout | None, platform: str,
) -> LayoutResolution:
    """The one layout for the model (utils.py `resolve_kv_cache_layout`): the merged candidates,
    block-compact only where the specs mix shapes or a connector meets the extensible KV
    cache; then an explicit layout must be a candidate (else refused with vLLM's reason), the
    HiSparse connector's BLHNC is taken where it is one, else the first candidate."""
    candidates = merge_layouts(declared)
    where = "declared by the selected backends" if declared else "vLLM's default preference"
    if mixed_shapes or (extensible and hisparse):
        candidates = [name for name in candidates if KVCacheLayout(name).block_compact]
        if not candidates:
            raise UnsupportedRequestError(
                "the layers mix page shapes and need a block-compact layout, but none is in "
                "every supported set (vllm/v1/attention/backends/utils.py)")
        where += ", block-compact"
    if requested is not None:
        if requested.value not in candidates:
            raise UnsupportedRequestError(
                f"kv_cache_layout {requested.value}: vLLM 0.34 on {platform} refuses it: "
                f"VLLM_KV_CACHE_LAYOUT={requested.value} does not satisfy every supported set; "
                f"valid layouts: {candidates} (vllm/v1/attention/backends/utils.py "
                "resolve_kv_cache_layout)")
        return LayoutResolution(requested, tuple(candidates),
                                f"{requested.value} as asked ({where}: {', '.join(candidates)})")
    if hisparse and HISPARSE_CONNECTOR_LAYOUT.value in candidates:
        return LayoutResolution(HISPARSE_CONNECTOR_LAYOUT, tuple(candidates),
                                f"BLHNC, the HiSparse connector's ({where}: "
                                f"{', '.join(candidates)})")
    return LayoutResolution(KVCacheLayout(candidates[0]), tuple(candidates),
                            f"{candidates[0]}, the first of {where}: {', '.join(candidates)}")
