"""What plan contract 2 promises about pools for any engine (docs/plan-contract.md#pools):
names, tensors in their pool, explicit page ranges inside their allocation and apart from one
another, engine views inside their pages (checking/views.py).

Tensors with explicit `ranges` (SGLang's) are proved here, allocation by allocation: a pool with
one allocation per layer is proved once per layer, since its layers share no address space.
Nothing in such a pool may share a byte (no overlaid groups), so every train is its own group's
member of one group: any meeting of two runs is a clash. Cost grows with tensors, layers and
ranges, never with blocks or tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from typing import Literal

from hisparse_plan.checking.geometry import prove_disjoint
from hisparse_plan.checking.views import check_views
from hisparse_plan.errors import PlanInvariantError
from hisparse_plan.models.plan import DevicePool, HostPool, KVCacheTensor
from hisparse_plan.models.pools import Pool, stage_pool_name
from hisparse_plan.views import Train

ONE_GROUP = 0
"""Nothing overlays in a pool of explicit ranges: every train counts as one group's."""


def check_pool_names(pools: Sequence[Pool], tensors: Sequence[KVCacheTensor]) -> dict[str, Pool]:
    """Pools by name; refuse a name given twice, a tensor naming no pool, or a tensor whose
    `host_resident` disagrees with its pool's location."""
    by_name: dict[str, Pool] = {}
    for index, pool in enumerate(pools):
        if pool.name in by_name:
            raise PlanInvariantError(
                f"pools[{index}] is named {pool.name!r} like an earlier pool; expected unique "
                "pool names"
            )
        by_name[pool.name] = pool
    for index, tensor in enumerate(tensors):
        named = by_name.get(tensor.pool)
        if named is None:
            raise PlanInvariantError(
                f"tensors[{index}] names pool {tensor.pool!r}; expected one of "
                f"{sorted(by_name)}", tensor=index, layer=tensor.layers[0],
            )
        if tensor.host_resident != (named.location == "host"):
            raise PlanInvariantError(
                f"tensors[{index}] has host_resident {tensor.host_resident} in the "
                f"{named.location} pool {named.name!r}; expected {named.location == 'host'}",
                tensor=index, layer=tensor.layers[0],
            )
    return by_name


def check_ranged_tensors(pools: dict[str, Pool], tensors: Sequence[KVCacheTensor]) -> None:
    """Every tensor with explicit ranges: its pages inside their allocation, no two pages (or
    ranges) sharing a byte, every view inside its own pages or its allocation's unowned tail
    and apart from the others (`check_views`); each layer placed once per pool."""
    trains: dict[tuple[str, str | None], list[Train]] = {}
    placed: dict[tuple[str, str], int] = {}
    for index, tensor in enumerate(tensors):
        if tensor.ranges is None:
            continue
        pool = pools[tensor.pool]
        per_layer = pool.allocation == "per_layer"
        if per_layer and tensor.layer_stride != 0:
            raise PlanInvariantError(
                f"tensors[{index}] strides layers by {tensor.layer_stride} bytes in the "
                f"per-layer pool {pool.name!r}; expected 0 (each layer has its own buffer)",
                tensor=index, layer=tensor.layers[0],
            )
        if tensor.size != pool.size:
            raise PlanInvariantError(
                f"tensors[{index}] has size {tensor.size}; expected its pool {pool.name!r}'s "
                f"{pool.size} bytes", tensor=index, layer=tensor.layers[0],
            )
        _check_ranges(index, tensor)
        for position, layer in enumerate(tensor.layers):
            earlier = placed.get((pool.name, layer))
            placed[pool.name, layer] = index
            if earlier is not None:
                by = (f"twice by tensors[{index}]" if earlier == index
                      else f"by tensors[{earlier}] and tensors[{index}]")
                raise PlanInvariantError(
                    f"layer {layer!r} is placed in pool {pool.name!r} {by}; expected once per "
                    "pool", tensor=index, layer=layer,
                )
            start = tensor.offset + position * tensor.layer_stride
            key = (pool.name, layer if per_layer else None)
            trains.setdefault(key, []).extend(
                Train(start + part.offset, part.size, tensor.block_stride, pool.num_blocks,
                      index, layer, ONE_GROUP)
                for part in tensor.ranges
            )
    for (name, owner), members in trains.items():
        where = name if owner is None else f"{name} (layer {owner!r})"
        prove_disjoint(where, members, pools[name].num_blocks, pools[name].size)
    # The pages are apart and inside: the views are proved against them.
    check_views(pools, tensors)


def _check_ranges(index: int, tensor: KVCacheTensor) -> None:
    """A page's ranges in order and apart (how far they may reach is the disjointness
    proof's)."""
    ranges = tensor.ranges or []
    for previous, current in pairwise(ranges):
        if current.offset < previous.offset + previous.size:
            raise PlanInvariantError(
                f"tensors[{index}] has a page range at {current.offset} inside the one at "
                f"{previous.offset} ({previous.size} bytes); expected ranges in order and apart",
                tensor=index, layer=tensor.layers[0],
            )


def check_vllm_pools(
    pools: dict[str, Pool], tensors: Sequence[KVCacheTensor], host: HostPool | None,
    device: Sequence[DevicePool], num_blocks: int, stages: Sequence[int],
) -> None:
    """A vLLM plan's `pools` are its host pool and device pools, each with the null block as
    its one padding block, and each tensor names the pool of its stage; no explicit ranges or
    views (vLLM's views follow from the group specs)."""
    expected: dict[str, tuple[object, ...]] = {}
    if host is not None:
        expected[stage_pool_name("host", 0, 1)] = (
            "host", 0, "whole", host.size, host.num_blocks, None, 1, host.shared)
    for stage, pool in enumerate(device):
        expected[stage_pool_name("device", stage, len(device))] = (
            "device", stage, "whole", pool.size, num_blocks, None, 1, False)
    fields = ("location", "stage", "allocation", "size", "num_blocks", "block_tokens",
              "padding_blocks", "shared")
    if list(pools) != list(expected):
        raise PlanInvariantError(
            f"pools are named {list(pools)}; expected {list(expected)} for this plan's host "
            "and device pools"
        )
    for name, want in expected.items():
        got = tuple(getattr(pools[name], field) for field in fields)
        for field, a, b in zip(fields, got, want, strict=True):
            if a != b:
                raise PlanInvariantError(
                    f"pool {name!r} has {field} {a!r}; expected {b!r} (from host_pool, "
                    "device_pools and num_blocks)"
                )
    for index, (tensor, stage) in enumerate(zip(tensors, stages, strict=True)):
        location: Literal["device", "host"] = "host" if tensor.host_resident else "device"
        want_name = stage_pool_name(location, stage, len(device))
        if tensor.pool != want_name:
            raise PlanInvariantError(
                f"tensors[{index}] names pool {tensor.pool!r}; expected {want_name!r}, the "
                f"{location} pool of its stage", tensor=index, layer=tensor.layers[0],
            )
        if tensor.ranges is not None or tensor.views:
            raise PlanInvariantError(
                f"tensors[{index}] carries explicit ranges or views; expected none in a vLLM "
                "plan (its pages follow from the group specs)",
                tensor=index, layer=tensor.layers[0],
            )
