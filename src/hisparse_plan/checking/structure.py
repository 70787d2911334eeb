"""Who is placed where: every layer in one group, every group layer in one tensor (SPEC 5.11)."""

from __future__ import annotations

from hisparse_plan.errors import PlanInvariantError
from hisparse_plan.models import (
    HOT_SUFFIX,
    RESIDENT_SUFFIX,
    GroupSpec,
    HisparseHotSpec,
    HisparseResidentSpec,
    KVCachePlan,
    UniformTypeSpec,
)
from hisparse_plan.views import pool_name, stage_of, tensor_stage


def check_structure(plan: KVCachePlan, specs: dict[str, tuple[int, GroupSpec]]) -> None:
    """`specs` is `views.spec_of(plan)`, worked out once for every check."""
    _check_groups(plan)
    _check_roles(plan)
    _check_derived_layers(plan, specs)
    _check_stage_layers(plan, specs)
    _check_placement(plan, specs)
    _check_pool_sizes(plan)


def _check_groups(plan: KVCachePlan) -> None:
    owner: dict[str, int] = {}
    for index, group in enumerate(plan.groups):
        for name in group.layer_names:
            if name in owner:
                raise PlanInvariantError(
                    f"layer {name!r} is listed by groups[{owner[name]}] and groups[{index}]; "
                    "expected each layer in exactly one group",
                    layer=name,
                )
            owner[name] = index
        spec = group.spec
        if isinstance(spec, UniformTypeSpec) and list(spec.specs) != group.layer_names:
            raise PlanInvariantError(
                f"groups[{index}].spec.specs names {list(spec.specs)[:4]}...; expected exactly "
                f"the group's layer_names in order, {group.layer_names[:4]}...",
                layer=group.layer_names[0],
            )


def _check_roles(plan: KVCachePlan) -> None:
    sources = [i for i, group in enumerate(plan.groups) if group.role == "hisparse_source"]
    expected = 0 if plan.host_pool is None else 1
    if len(sources) != expected:
        pool = "no host pool" if plan.host_pool is None else "a host pool"
        raise PlanInvariantError(
            f"the plan has {pool}, so expected {expected} hisparse_source group(s), "
            f"got {len(sources)}"
        )
    for index, group in enumerate(plan.groups):
        if group.host_resident != (group.role == "hisparse_source"):
            raise PlanInvariantError(
                f"groups[{index}] ({group.role}) has host_resident {group.host_resident}; "
                "expected only the hisparse_source group in host memory",
                layer=group.layer_names[0],
            )


def _check_derived_layers(plan: KVCachePlan, specs: dict[str, tuple[int, GroupSpec]]) -> None:
    """Resident and hot layers mirror the source layers: one of each per source layer."""
    source = next((g for g in plan.groups if g.role == "hisparse_source"), None)
    source_names = set() if source is None else set(source.layer_names)
    for kind, suffix in (("hisparse_resident", RESIDENT_SUFFIX), ("hisparse_hot", HOT_SUFFIX)):
        derived = [
            name
            for group in plan.groups
            if isinstance(group.spec, HisparseResidentSpec | HisparseHotSpec)
            and group.spec.kind == kind
            for name in group.layer_names
        ]
        seen = set()
        for name in derived:
            base = name[: -len(suffix)] if name.endswith(suffix) else None
            if base is None or base not in source_names:
                raise PlanInvariantError(
                    f"{kind} layer {name!r} does not derive from a source layer; expected "
                    f"'<source layer>{suffix}'",
                    layer=name,
                )
            page, source_page = specs[name][1].page_size_bytes, specs[base][1].page_size_bytes
            if page != source_page:
                raise PlanInvariantError(
                    f"{kind} layer {name!r} has pages of {page} bytes; expected its source "
                    f"layer's {source_page}",
                    layer=name,
                )
            seen.add(base)
        missing = [name for name in (source.layer_names if source else []) if name not in seen]
        if missing:
            raise PlanInvariantError(
                f"source layer {missing[0]!r} has no {kind} layer; expected one per source layer",
                layer=missing[0],
            )


def _check_stage_layers(plan: KVCachePlan, specs: dict[str, tuple[int, GroupSpec]]) -> None:
    """Stages that list their layers (device.pipeline_stages, one stage or more) list every
    device layer exactly once, and nothing else; several stages must list them."""
    listed = [pool.layers is not None for pool in plan.device_pools]
    if not any(listed) and len(listed) == 1:
        return  # one stage holds every layer
    if not all(listed):
        stage = listed.index(False)
        raise PlanInvariantError(
            f"device_pools[{stage}].layers is null beside {len(listed) - 1} other stage(s); "
            "expected every pipeline stage to list its layers"
        )
    owner: dict[str, int] = {}
    for stage, pool in enumerate(plan.device_pools):
        for name in pool.layers or []:
            found = specs.get(name)
            if found is None or plan.groups[found[0]].host_resident:
                raise PlanInvariantError(
                    f"device_pools[{stage}].layers names {name!r}; expected device layers of "
                    "the plan's groups", layer=name,
                )
            if name in owner:
                raise PlanInvariantError(
                    f"device_pools[{stage}].layers names {name!r}, which stage {owner[name]} "
                    "lists too; expected every device layer in exactly one stage", layer=name,
                )
            owner[name] = stage
    missing = next((name for name, (group, _) in specs.items()
                    if name not in owner and not plan.groups[group].host_resident), None)
    if missing is not None:
        raise PlanInvariantError(
            f"layer {missing!r} is in no stage's device_pools[*].layers; expected every device "
            "layer in exactly one stage", layer=missing,
        )


def _check_placement(plan: KVCachePlan, specs: dict[str, tuple[int, GroupSpec]]) -> None:
    placed: dict[str, int] = {}
    for index, tensor in enumerate(plan.tensors):
        first = tensor.layers[0]
        if first not in specs:
            raise PlanInvariantError(
                f"tensors[{index}] places layer {first!r}, which no group lists",
                tensor=index, layer=first,
            )
        group, spec = specs[first]
        for name in tensor.layers:
            if name in placed:
                raise PlanInvariantError(
                    f"layer {name!r} is placed by tensors[{placed[name]}] and tensors[{index}]; "
                    "expected exactly one place per layer",
                    tensor=index, layer=name,
                )
            placed[name] = index
            found = specs.get(name)
            if found is None or found[0] != group or found[1] != spec:
                raise PlanInvariantError(
                    f"tensors[{index}] holds {name!r} beside {first!r}; expected one tensor to "
                    "hold layers of one group and one spec",
                    tensor=index, layer=name,
                )
        if tensor.host_resident != plan.groups[group].host_resident:
            where = "host" if tensor.host_resident else "device"
            raise PlanInvariantError(
                f"tensors[{index}] puts {first!r} of groups[{group}] ({plan.groups[group].role}) "
                f"in the {where} pool; expected source layers on the host, all others on the "
                "device",
                tensor=index, layer=first,
            )
    for name in specs:
        if name not in placed:
            raise PlanInvariantError(
                f"layer {name!r} of groups[{specs[name][0]}] is in no tensor; expected every "
                "group layer placed",
                layer=name,
            )


def _check_pool_sizes(plan: KVCachePlan) -> None:
    """Every tensor states its pool's size; with pipeline stages, a stage's tensors hold only
    that stage's layers (SPEC 5.11, 6.1)."""
    if plan.host_pool is not None:
        host = plan.host_pool
        if host.size != host.bytes_per_block * host.num_blocks:
            raise PlanInvariantError(
                f"the host pool's size is {host.size}; expected bytes_per_block "
                f"{host.bytes_per_block} * num_blocks {host.num_blocks}"
            )
    for stage, device in enumerate(plan.device_pools):
        if device.size != device.bytes_per_block * plan.num_blocks:
            raise PlanInvariantError(
                f"the {pool_name(plan, stage)} pool's size is {device.size}; expected "
                f"bytes_per_block {device.bytes_per_block} * num_blocks {plan.num_blocks}"
            )
    stages = stage_of(plan)
    for index, tensor in enumerate(plan.tensors):
        if tensor.host_resident:
            size, pool = (plan.host_pool.size if plan.host_pool else 0), "host"
        else:
            stage = tensor_stage(plan, index, stages)
            size, pool = plan.device_pools[stage].size, pool_name(plan, stage)
            strays = [n for n in tensor.layers if stages and stages.get(n) != stage]
            if strays:
                raise PlanInvariantError(
                    f"tensors[{index}] places {strays[0]!r} in the {pool} pool beside "
                    f"{tensor.layers[0]!r}; expected one stage's layers per tensor (stage "
                    f"{stages.get(strays[0])} holds {strays[0]!r})",
                    tensor=index, layer=strays[0],
                )
        if tensor.size != size:
            raise PlanInvariantError(
                f"tensors[{index}] says the {pool} pool has {tensor.size} bytes; expected "
                f"{size}",
                tensor=index, layer=tensor.layers[0],
            )
