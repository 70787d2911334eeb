"""Gemma-3n's cross-layer KV sharing through the vLLM adapter, against vLLM 0.34 itself
(skipped where vLLM is not installed).

vLLM's worker gives the 15 sharing layers no KVCacheSpec, so its planner sees 20 layers; the
plan of the request with the sharing layers declared must be vLLM's KVCacheConfig of those 20,
and vLLM's `add_kv_sharing_layers_to_kv_cache_groups` must list each sharing layer in the group
of the target the plan's `kv_sharing` names."""

from __future__ import annotations

import importlib

import pytest

from support import paths

pytest.importorskip("vllm")

import hisparse_plan as hp
from hisparse_plan.adapters.vllm import request_from_vllm, to_kv_cache_config
from hisparse_plan.presets import Settings, build_request
from hisparse_plan.presets.config_file import load_config_file
from support import vllm_support as vs

worker_utils = importlib.import_module("vllm.v1.worker.utils")
GEMMA3N = paths.HF_CONFIGS / "gemma-3n-e4b-it" / "config.json"


def gemma3n() -> hp.PlanRequest:
    arch = load_config_file(GEMMA3N, use_transformers=False)
    return build_request(arch, Settings(max_model_len=4096, gpu_mem_bytes=8 * 2**30))


def test_the_plan_is_vllms_config_of_the_allocating_layers() -> None:
    request = gemma3n()
    data = request.model_dump(mode="json")
    sharing = {name: layer.pop("kv_sharing_target") for name, layer in data["layers"].items()
               if "kv_sharing_target" in layer}
    for name in sharing:
        del data["layers"][name]
    inputs = vs.vllm_inputs(data)  # what vLLM's worker hands its planner: 20 specs
    assert len(inputs.specs) == 20
    theirs = vs.engine_configs(inputs)[0]
    plan = hp.plan(request)
    interval = inputs.config.cache_config.prefix_cache_retention_interval
    ours = to_kv_cache_config(plan, inputs.specs, prefix_cache_retention_interval=interval)
    assert vs.canonical(ours) == vs.canonical(theirs)
    # vLLM's worker then adds each sharing layer to its target's group.
    worker_utils.add_kv_sharing_layers_to_kv_cache_groups(sharing, theirs.kv_cache_groups)
    group_of = {layer: index for index, group in enumerate(theirs.kv_cache_groups)
                for layer in group.layer_names}
    for layer, target in plan.kv_sharing.items():
        assert group_of[layer] == group_of[target]
    assert plan.kv_sharing == sharing
    # And the adapter reads the sharing back into the same request.
    with vs.vllm_world(vs.DEFAULT_BUILDER, False):
        back = request_from_vllm(inputs.specs, inputs.config, inputs.available_bytes,
                                 shared_kv_cache_layers=sharing)
    assert back.layers == request.layers
