"""Sorting the request's layers into source, indexer and regular groups (SPEC 5.2, 5.3)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hisparse_plan.errors import PlanError, UnsupportedRequestError
from hisparse_plan.models import (
    KVCacheGroup,
    LayerSpec,
    MLASpec,
    PlanRequest,
)
from hisparse_plan.planning.buckets import (
    LayerRun,
    PlacedGroup,
    SpecBucket,
    members,
    merge_runs,
    uniform_spec,
)

Role = Literal["sparse", "indexer", "regular"]


@dataclass(frozen=True, slots=True)
class HisparseLayers:
    """The request's layers, split the way HiSparse places them.

    Runs are consecutive layers of one role that share one spec object, in model order: a
    validated request shares equal specs, so a model whose layers repeat one spec is a run or
    two, and per-layer work shrinks to handling names.
    """

    source_runs: list[LayerRun]
    source_buckets: list[SpecBucket]
    indexer_runs: list[LayerRun]
    indexer_buckets: list[SpecBucket]
    regular: PlacedGroup | None
    block_size: int


def split_layers(request: PlanRequest) -> HisparseLayers:
    runs = layer_runs(request)
    source, indexer = runs["sparse"], runs["indexer"]
    if request.hisparse is None or not (source or indexer):
        why = "hisparse is null" if request.hisparse is None else "no layer has kind 'mla'"
        raise UnsupportedRequestError(
            f"only the HiSparse path is planned so far (SPEC 7, regular planning, is not "
            f"supported yet): expected hisparse settings and MLA layers, but {why}",
            field="hisparse" if request.hisparse is None else "layers",
        )
    block_size = _one_block_size(request, source + indexer)
    regular_group = _regular_group(runs["regular"])
    _refuse_model_version(request, source + indexer)
    if not source or not indexer:
        counts = [sum(len(run.names) for run in role) for role in (source, indexer)]
        raise PlanError(
            "HiSparse needs both sparse (source) layers and indexer layers; got "
            f"{counts[0]} with cache_role 'sparse' and {counts[1]} with 'indexer'",
            field="layers",
        )
    return HisparseLayers(
        source, merge_runs(source), indexer, merge_runs(indexer), regular_group, block_size
    )


def layer_runs(request: PlanRequest) -> dict[Role, list[LayerRun]]:
    """Each role's layers as runs of one spec object, in model order.

    A validated request shares one object per distinct spec, so a model that repeats its
    layer specs becomes a run or two per role, and later steps work per run, not per layer.
    """
    runs: dict[Role, list[LayerRun]] = {"sparse": [], "indexer": [], "regular": []}
    role_of: dict[int, list[LayerRun]] = {}  # by spec identity: the runs of its role
    for name, spec in request.layers.items():
        role_runs = role_of.get(id(spec))
        if role_runs is None:
            role_runs = role_of[id(spec)] = runs[_role(spec)]
        if role_runs and role_runs[-1].spec is spec:
            role_runs[-1].names.append(name)
        else:
            role_runs.append(LayerRun(spec, [name]))
    return runs


def _role(spec: LayerSpec) -> Role:
    return spec.cache_role if isinstance(spec, MLASpec) else "regular"


def _mla_layers(request: PlanRequest) -> list[tuple[str, MLASpec]]:
    return [(name, spec) for name, spec in request.layers.items() if isinstance(spec, MLASpec)]


def _one_block_size(request: PlanRequest, runs: list[LayerRun]) -> int:
    sizes = {run.spec.block_size for run in runs}
    if len(sizes) == 1:
        return sizes.pop()
    (first_name, first), *rest = _mla_layers(request)
    name, odd = next((name, spec) for name, spec in rest if spec.block_size != first.block_size)
    raise PlanError(
        f"layers[{name!r}].block_size: expected {first.block_size} like every MLA layer (the "
        f"first, {first_name!r}, has it), got {odd.block_size}",
        field=f"layers[{name!r}].block_size",
    )


def _refuse_model_version(request: PlanRequest, runs: list[LayerRun]) -> None:
    if all(getattr(run.spec, "model_version", None) != "deepseek_v4" for run in runs):
        return
    name = next(n for n, spec in _mla_layers(request) if spec.model_version == "deepseek_v4")
    raise UnsupportedRequestError(
        f"layers[{name!r}].model_version: 'deepseek_v4' is not supported by HiSparse planning",
        field=f"layers[{name!r}].model_version",
    )


def _regular_group(runs: list[LayerRun]) -> PlacedGroup | None:
    if not runs:
        return None
    first = runs[0].spec
    for spec, names in runs:
        if spec.kind != first.kind or spec.block_size != first.block_size:
            raise UnsupportedRequestError(
                f"layers[{names[0]!r}]: hybrid models are not supported yet (SPEC 7): every "
                f"non-MLA layer must have the kind and block size of {runs[0].names[0]!r} "
                f"({first.kind}, {first.block_size}), got {spec.kind}, {spec.block_size}",
                field=f"layers[{names[0]!r}]",
            )
    buckets = merge_runs(runs)
    specs = members(runs)
    group = KVCacheGroup.trusted({
        "layer_names": list(specs),
        "spec": first if len(buckets) == 1 else uniform_spec(specs, buckets),
        "role": "default",
        "host_resident": False,
        "enable_kv_transfer": True,
    })
    return PlacedGroup(group, buckets)
