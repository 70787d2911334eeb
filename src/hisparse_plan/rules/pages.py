"""Pages a planner must refuse before grouping (SPEC 7.1, 5.13, 7.12)."""

from __future__ import annotations

from collections.abc import Sequence

from hisparse_plan.errors import PlanError
from hisparse_plan.models import (
    LatentLayerSpec,
    LayerSpec,
    MambaSpec,
    MLASpec,
    SlidingWindowMLASpec,
)
from hisparse_plan.rules.families import one_family

Layer = tuple[str, LayerSpec]


def check_pages(layers: Sequence[Layer]) -> None:
    """Refuse an empty page, a Mamba padding below its states, and the 7.12 asymmetries."""
    seen: set[int] = set()
    distinct: list[Layer] = []
    alignments: dict[tuple[object, ...], tuple[str, LatentLayerSpec]] = {}
    for name, spec in layers:
        if id(spec) in seen:
            continue
        seen.add(id(spec))
        distinct.append((name, spec))
        _check_page(name, spec)
        if isinstance(spec, LatentLayerSpec):
            twin_name, twin = alignments.setdefault(_all_but_alignment(spec), (name, spec))
            if twin.alignment != spec.alignment:
                raise PlanError(
                    f"layers[{name!r}].alignment: layers that differ only in alignment must "
                    f"share one (SPEC 7.12); expected {twin.alignment} like {twin_name!r}, got "
                    f"{spec.alignment}",
                    field=f"layers[{name!r}].alignment",
                )
    if distinct:
        _check_merged_windows(distinct)


def _merge_key(spec: SlidingWindowMLASpec) -> tuple[object, ...]:
    """What vLLM 0.33's SlidingWindowMLASpec.merge compares (block size, sizes, dtype and
    alignment it does not): two specs with one key merge into the first one's spec."""
    return (spec.sliding_window, spec.cache_dtype, spec.compress_ratio, spec.model_version,
            spec.block_stride_alignment)


def _check_merged_windows(distinct: Sequence[Layer]) -> None:
    """7.12: refuse sliding_window_mla layers that vLLM 0.33 would merge into one spec
    although they are not one spec (it would plan them all with the first one's page and
    block size). `distinct` holds each distinct spec once, with its first layer, in request
    order.

    vLLM merges such layers in two places: its uniform-spec test (7.3 step 1), when every
    layer is a sliding_window_mla layer with the first one's merge key; and its unified-pages
    bucketing (7.3.2), which joins buckets whose specs merge. Everywhere else (one family, and
    packed groups) each layer keeps its own spec, so layers that share a window but differ
    (DeepSeek-V4's compressor states) are planned soundly. The unified-pages case is judged
    without the layout (a block-outermost layout would pack such layers instead), so it
    refuses whenever those pages could be unified at all.
    """
    windowed = [
        (name, spec) for name, spec in distinct if isinstance(spec, SlidingWindowMLASpec)
    ]
    if len(windowed) == len(distinct):
        lead = windowed[0]
        if all(_merge_key(spec) == _merge_key(lead[1]) for _, spec in windowed):
            for layer in windowed[1:]:
                if layer[1] != lead[1]:
                    _refuse_merge(layer, lead, "its uniform-spec test")
            return
    if one_family([spec for _, spec in distinct]) or _pages_cannot_unify(distinct):
        return
    first_of: dict[tuple[object, ...], tuple[str, SlidingWindowMLASpec]] = {}
    for layer in windowed:
        twin = first_of.setdefault(_merge_key(layer[1]), layer)
        if twin[1] != layer[1]:
            _refuse_merge(layer, twin, "its unified-pages bucketing (7.3.2)")


def _pages_cannot_unify(distinct: Sequence[Layer]) -> bool:
    """Some mla page does not divide the largest page: 7.3.2 can never plan these layers
    (and 7.3.3 does not take sliding_window_mla layers)."""
    largest = max(spec.page_size_bytes for _, spec in distinct)
    return any(
        isinstance(spec, MLASpec) and largest % spec.page_size_bytes for _, spec in distinct
    )


def _refuse_merge(
    layer: tuple[str, SlidingWindowMLASpec], twin: tuple[str, SlidingWindowMLASpec], where: str
) -> None:
    name, spec = layer
    twin_name, twin_spec = twin
    raise PlanError(
        f"layers[{name!r}]: sliding_window_mla layers that share window {spec.sliding_window} "
        f"and that vLLM 0.33 would merge in {where} must be identical (SPEC 7.12); expected "
        f"the spec of {twin_name!r}, got one that differs in "
        f"{_differing_fields(twin_spec, spec)}",
        field=f"layers[{name!r}]",
    )


def _check_page(name: str, spec: LayerSpec) -> None:
    if isinstance(spec, MambaSpec):
        if spec.page_size_padded is not None and spec.page_size_padded < spec.content_bytes:
            raise PlanError(
                f"layers[{name!r}].page_size_padded: expected at least the {spec.content_bytes} "
                f"bytes of its states, got {spec.page_size_padded}",
                field=f"layers[{name!r}].page_size_padded",
            )
        return
    if spec.page_size_padded is not None and spec.page_size_padded < spec.natural_page_bytes:
        raise PlanError(
            f"layers[{name!r}].page_size_padded: expected at least its natural page of "
            f"{spec.natural_page_bytes} bytes, got {spec.page_size_padded}",
            field=f"layers[{name!r}].page_size_padded",
        )
    if spec.page_size_bytes == 0:
        ratio = spec.compress_ratio if isinstance(spec, LatentLayerSpec) else 1
        raise PlanError(
            f"layers[{name!r}]: block_size {spec.block_size} stores no state at compress_ratio "
            f"{ratio}; expected block_size >= compress_ratio (a page of at least one state)",
            field=f"layers[{name!r}].block_size",
        )


def _all_but_alignment(spec: LatentLayerSpec) -> tuple[object, ...]:
    return tuple(
        value
        for key, value in spec.__dict__.items()
        if key not in ("alignment", "page_size_bytes")
    )


def _differing_fields(a: LayerSpec, b: LayerSpec) -> str:
    fields = [key for key, value in a.__dict__.items() if b.__dict__.get(key) != value]
    return ", ".join(fields)
