"""Reading a version 1 plan (vLLM, before pools were listed) as a version 2 plan."""

from __future__ import annotations

from typing import Any

from hisparse_plan.models.pools import stage_pool_name
from hisparse_plan.models.request import HOT_SUFFIX, RESIDENT_SUFFIX

HISPARSE_SUFFIXES = (RESIDENT_SUFFIX, HOT_SUFFIX)


def upgrade_version_1(data: object) -> object:
    """A version 1 plan's JSON with version 2's pools and tensor pool names filled in; anything
    else unchanged (validation then reports what is wrong with it)."""
    if not isinstance(data, dict) or data.get("schema_version", 1) != 1 or "pools" in data:
        return data
    device_pools = data.get("device_pools")
    tensors = data.get("tensors")
    if not isinstance(device_pools, list) or not isinstance(tensors, list):
        return data
    upgraded = dict(data, schema_version=2)
    pools: list[dict[str, Any]] = []
    host = data.get("host_pool")
    if isinstance(host, dict):
        pools.append({
            "name": stage_pool_name("host", 0, 1), "location": "host", "allocation": "whole",
            "size": host.get("size"), "num_blocks": host.get("num_blocks"),
            "block_tokens": None, "padding_blocks": 1, "shared": host.get("shared", False),
        })
    for stage, pool in enumerate(device_pools):
        pools.append({
            "name": stage_pool_name("device", stage, len(device_pools)), "location": "device",
            "stage": stage, "allocation": "whole",
            "size": pool.get("size") if isinstance(pool, dict) else None,
            "num_blocks": data.get("num_blocks"), "block_tokens": None, "padding_blocks": 1,
        })
    upgraded["pools"] = pools
    upgraded["tensors"] = [_named(tensor, device_pools) for tensor in tensors]
    return upgraded


def _named(tensor: object, device_pools: list[Any]) -> object:
    if not isinstance(tensor, dict) or "pool" in tensor:
        return tensor
    if tensor.get("host_resident") is True:
        return dict(tensor, pool=stage_pool_name("host", 0, 1))
    return dict(tensor, pool=stage_pool_name("device", _stage(tensor, device_pools),
                                            len(device_pools)))


def _stage(tensor: dict[str, Any], device_pools: list[Any]) -> int:
    layers = tensor.get("layers")
    first = layers[0] if isinstance(layers, list) and layers else None
    if not isinstance(first, str):
        return 0
    for suffix in HISPARSE_SUFFIXES:
        first = first.removesuffix(suffix)
    for stage, pool in enumerate(device_pools):
        held = pool.get("layers") if isinstance(pool, dict) else None
        if held is None or first in held:
            return stage
    return 0
