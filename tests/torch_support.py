"""Plans and helpers shared by the torch backend tests; this module holds no tests itself."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from typing import Any

import pytest

import hisparse_plan as hp
from golden import load

torch = pytest.importorskip("torch")

SMALL_GOLDEN = "bf16_small_with_full_attention"
MIB = 2**20


def plan_of(request: dict[str, Any]) -> hp.KVCachePlan:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", hp.PlanWarning)
        return hp.plan(hp.PlanRequest.model_validate(request))


def plan_or_none(request: dict[str, Any]) -> hp.KVCachePlan | None:
    try:
        return plan_of(request)
    except hp.PlanError:
        return None


def golden_plan(case: str) -> hp.KVCachePlan:
    return plan_of(load(case)[0])


def small_request() -> dict[str, Any]:
    """The small golden case with its host pool cut to ~38 MiB: every block can be verified."""
    request = copy.deepcopy(load(SMALL_GOLDEN)[0])
    # 130 host blocks of 294912 bytes: one 8192-token request, the null block and a tail.
    request["hisparse"]["host_pool_gib"] = 130 * 294912 / 2**30
    return request


def small_plan() -> hp.KVCachePlan:
    return plan_of(small_request())


def exact_fit_plan() -> hp.KVCachePlan:
    """Indexer pages half the source page: the indexer group and every resident and hot group
    fill the device block exactly, so one page less of block stride overlaps the next block."""
    sparse = {"kind": "mla", "block_size": 16, "head_size": 64, "dtype": "bfloat16",
              "cache_role": "sparse", "is_index_group_leader": True}
    indexer = {"kind": "mla", "block_size": 16, "head_size": 32, "dtype": "bfloat16",
               "cache_role": "indexer"}
    layers: dict[str, Any] = {}
    for i in range(4):
        layers[f"model.layers.{i}.self_attn.attn"] = sparse
        layers[f"model.layers.{i}.self_attn.indexer.k_cache"] = indexer
    return plan_of({
        "layers": layers,
        "model": {"max_model_len": 256, "index_topk": 32},
        "hisparse": {"host_pool_gib": 64 * 8192 / 2**30},
        "device": {"available_bytes": MIB},
    })


def two_tensor_source_plan() -> hp.KVCachePlan:
    """Source layers of two specs with one page size: the host group has two tensors."""
    request = small_request()
    for i in (2, 3):
        name = f"model.layers.{i}.self_attn.attn"
        request["layers"][name] = {**request["layers"][name], "cache_dtype": "variant"}
    return plan_of(request)


def tampered(plan: hp.KVCachePlan, edit: Callable[[dict[str, Any]], None]) -> hp.KVCachePlan:
    """The plan with its JSON edited and validated back, the static checker never asked."""
    dumped = plan.model_dump(mode="json")
    edit(dumped)
    return hp.KVCachePlan.model_validate(dumped)


def tensor_index(plan: hp.KVCachePlan, first_layer: str) -> int:
    return next(i for i, t in enumerate(plan.tensors) if t.layers[0] == first_layer)
