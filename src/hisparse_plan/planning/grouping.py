"""Sorting the request's layers into source, indexer and regular groups (SPEC 5.2, 5.3)."""

from __future__ import annotations

from dataclasses import dataclass

from hisparse_plan.errors import PlanError, UnsupportedRequestError
from hisparse_plan.models import (
    FullAttentionSpec,
    KVCacheGroup,
    LayerSpec,
    MLASpec,
    PlanRequest,
    SlidingWindowSpec,
)
from hisparse_plan.planning.buckets import PlacedGroup, SpecBucket, bucket_layers, uniform_spec

Layer = tuple[str, MLASpec]
RegularSpec = FullAttentionSpec | SlidingWindowSpec


@dataclass(frozen=True, slots=True)
class HisparseLayers:
    """The request's layers, split the way HiSparse places them."""

    source: list[Layer]
    source_buckets: list[SpecBucket]
    indexer: list[Layer]
    indexer_buckets: list[SpecBucket]
    regular: PlacedGroup | None
    block_size: int


def split_layers(request: PlanRequest) -> HisparseLayers:
    source: list[Layer] = []
    indexer: list[Layer] = []
    regular: list[tuple[str, RegularSpec]] = []
    for layer in request.layers.items():
        spec = layer[1]
        if not isinstance(spec, MLASpec):
            regular.append((layer[0], spec))
        elif spec.cache_role == "sparse":
            source.append((layer[0], spec))
        else:
            indexer.append((layer[0], spec))
    if request.hisparse is None or not (source or indexer):
        why = "hisparse is null" if request.hisparse is None else "no layer has kind 'mla'"
        raise UnsupportedRequestError(
            f"only the HiSparse path is planned so far (SPEC 7, regular planning, is not "
            f"supported yet): expected hisparse settings and MLA layers, but {why}",
            field="hisparse" if request.hisparse is None else "layers",
        )
    source_buckets = bucket_layers(source) if source else []
    indexer_buckets = bucket_layers(indexer) if indexer else []
    block_size = _one_block_size(request, source_buckets + indexer_buckets)
    regular_group = _regular_group(regular)
    _refuse_model_version(request, source_buckets + indexer_buckets)
    if not source or not indexer:
        raise PlanError(
            "HiSparse needs both sparse (source) layers and indexer layers; got "
            f"{len(source)} with cache_role 'sparse' and {len(indexer)} with 'indexer'",
            field="layers",
        )
    return HisparseLayers(
        source, source_buckets, indexer, indexer_buckets, regular_group, block_size
    )


def _mla_layers(request: PlanRequest) -> list[Layer]:
    return [(name, spec) for name, spec in request.layers.items() if isinstance(spec, MLASpec)]


def _one_block_size(request: PlanRequest, buckets: list[SpecBucket]) -> int:
    sizes = {bucket.spec.block_size for bucket in buckets}
    if len(sizes) == 1:
        return sizes.pop()
    (first_name, first), *rest = _mla_layers(request)
    name, odd = next((name, spec) for name, spec in rest if spec.block_size != first.block_size)
    raise PlanError(
        f"layers[{name!r}].block_size: expected {first.block_size} like every MLA layer (the "
        f"first, {first_name!r}, has it), got {odd.block_size}",
        field=f"layers[{name!r}].block_size",
    )


def _refuse_model_version(request: PlanRequest, buckets: list[SpecBucket]) -> None:
    if all(getattr(bucket.spec, "model_version", None) != "deepseek_v4" for bucket in buckets):
        return
    name = next(n for n, spec in _mla_layers(request) if spec.model_version == "deepseek_v4")
    raise UnsupportedRequestError(
        f"layers[{name!r}].model_version: 'deepseek_v4' is not supported by HiSparse planning",
        field=f"layers[{name!r}].model_version",
    )


def _regular_group(layers: list[tuple[str, RegularSpec]]) -> PlacedGroup | None:
    if not layers:
        return None
    first_name, first = layers[0]
    for name, spec in layers:
        if spec.kind != first.kind or spec.block_size != first.block_size:
            raise UnsupportedRequestError(
                f"layers[{name!r}]: hybrid models are not supported yet (SPEC 7): every "
                f"non-MLA layer must have the kind and block size of {first_name!r} "
                f"({first.kind}, {first.block_size}), got {spec.kind}, {spec.block_size}",
                field=f"layers[{name!r}]",
            )
    members: list[tuple[str, LayerSpec]] = list(layers)
    buckets = bucket_layers(members)
    group = KVCacheGroup.trusted(
        layer_names=[name for name, _ in layers],
        spec=first if len(buckets) == 1 else uniform_spec(dict(members), buckets),
        role="default",
        host_resident=False,
        enable_kv_transfer=True,
    )
    return PlacedGroup(group, buckets)
