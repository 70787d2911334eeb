"""SPEC 7.12: sliding_window_mla specs that vLLM would merge although they differ.

vLLM merges sliding_window_mla specs comparing only what `merge_key` holds (not block size,
sizes or dtype; 0.34 added alignment) and plans the merged layers with the first one's page and
block size. It merges in two places: its uniform-spec test (7.3 rule 1) and its unified-pages
bucketing (7.3.2, which joins buckets whose specs merge). A planner refuses exactly there.
Elsewhere (one family, packed groups) each layer keeps its own spec, so layers that share a
window but differ, like DeepSeek-V4's compressor states, are planned soundly.
"""

from __future__ import annotations

from collections.abc import Sequence

from hisparse_plan.errors import PlanError
from hisparse_plan.models import LayerSpec, SlidingWindowMLASpec

Layer = tuple[str, LayerSpec]


def merge_key(spec: SlidingWindowMLASpec) -> tuple[object, ...]:
    """What vLLM 0.34's sliding_window_mla merge compares; specs with one key merge (it also
    refuses to merge specs of different DCP sharding)."""
    return (spec.sliding_window, spec.cache_dtype, spec.compress_ratio, spec.model_version,
            spec.block_stride_alignment, spec.alignment, spec.dcp_sharded)


def refuse_uniform_merge(distinct: Sequence[Layer]) -> None:
    """7.3 rule 1: every layer is sliding_window_mla with one merge key, yet not one spec.

    `distinct`: each distinct spec once, with its first layer, in request order."""
    windowed = [(name, spec) for name, spec in distinct if isinstance(spec, SlidingWindowMLASpec)]
    if len(distinct) < 2 or len(windowed) < len(distinct):
        return
    lead = windowed[0]
    if all(merge_key(spec) == merge_key(lead[1]) for _, spec in windowed):
        _refuse(windowed[1], lead, "its uniform-spec test")


def refuse_bucket_merge(buckets: Sequence[Layer]) -> None:
    """7.3.2 step 2: two buckets of sliding_window_mla specs (pages already unified) that
    merge. `buckets`: each bucket's spec with its first layer, in bucket order."""
    first: dict[tuple[object, ...], tuple[str, SlidingWindowMLASpec]] = {}
    for name, spec in buckets:
        if isinstance(spec, SlidingWindowMLASpec):
            twin = first.setdefault(merge_key(spec), (name, spec))
            if twin[1] is not spec:
                _refuse((name, spec), twin, "its unified-pages bucketing (7.3.2)")


def _refuse(
    layer: tuple[str, SlidingWindowMLASpec], twin: tuple[str, SlidingWindowMLASpec], where: str
) -> None:
    (name, spec), (twin_name, twin_spec) = layer, twin
    differing = ", ".join(
        key for key, value in twin_spec.__dict__.items() if spec.__dict__.get(key) != value
    )
    raise PlanError(
        f"layers[{name!r}]: sliding_window_mla layers that share window {spec.sliding_window} "
        f"and that vLLM would merge in {where} must be identical; expected "
        f"the spec of {twin_name!r}, got one that differs in {differing}",
        field=f"layers[{name!r}]",
    )
