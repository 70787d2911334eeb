"""Issue 28 against vLLM itself (skipped where vLLM is not installed; see test_adapter_vllm.py
for the venv): the refusal of two chunk or window sizes under a disabled hybrid manager, and
`kv_tp_replicas` filled from the TP size."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest

pytest.importorskip("vllm")

import hisparse_plan as hp
from hisparse_plan.adapters.vllm import request_from_vllm, to_kv_cache_config
from support import golden
from support import vllm_support as vs

GIB = 2**30
ATTN = {"kind": "full_attention", "block_size": 16, "num_kv_heads": 8, "head_size": 128}
CHUNKED = {**ATTN, "kind": "chunked_local_attention", "attention_chunk_size": 8192}
SLIDING = {**ATTN, "kind": "sliding_window", "sliding_window": 128}
MESSAGE = "All attention layers in the same KV cache group must have the same window size"


def _request(layers: dict[str, Any], disabled: bool) -> dict[str, Any]:
    return {
        "layers": layers,
        "model": {"max_model_len": 4096},
        "device": {"available_bytes": 8 * GIB, "kv_cache_layout": "BLNHC"},
        "scheduler": {"disable_hybrid_kv_cache_manager": disabled},
    }


@pytest.mark.parametrize("layers", [
    {"l0": ATTN, "l1": CHUNKED, "l2": {**CHUNKED, "attention_chunk_size": 4096}},
    {"l0": ATTN, "l1": SLIDING, "l2": {**SLIDING, "sliding_window": 64}},
    {"l0": ATTN, "l1": SLIDING, "l2": CHUNKED},
    {"l0": ATTN, "l1": CHUNKED, "l2": CHUNKED},
])
@pytest.mark.parametrize("disabled", [True, False])
def test_two_sizes_refused_where_vllm_refuses_them(
    layers: dict[str, Any], disabled: bool
) -> None:
    request = _request(layers, disabled)
    try:
        vs.run_vllm(vs.vllm_inputs(request))
        refusal = None
    except ValueError as error:
        refusal = str(error)
    if refusal is None:
        hp.plan(request)
        return
    assert MESSAGE in refusal
    with pytest.raises(hp.PlanError, match="must have the same window size"):
        hp.plan(request)


def _with_tp(case: str, tp: int) -> vs.VllmInputs:
    """A golden case's inputs on `tp` ranks, its MLA layers with `max_tp_shards` 1 as vLLM's
    MLA attention and indexer layers declare them."""
    inputs = vs.vllm_inputs(golden.load(case)[0])
    specs = {
        name: dataclasses.replace(spec, max_tp_shards=1)
        if type(spec).__name__ == "MLAAttentionSpec" else spec
        for name, spec in inputs.specs.items()
    }
    config = copy.deepcopy(inputs.config)
    config.parallel_config.tensor_parallel_size = tp
    return dataclasses.replace(inputs, specs=specs, config=config)


@pytest.mark.parametrize(("case", "replicas"), [
    ("regular_deepseek_v32_no_hisparse_lbnhc", 4),  # every layer an MLA latent
    ("regular_llama3_8b_bf16", 1),  # heads split over the ranks
    ("deepseek_v32_fp8", 1),  # HiSparse's resident and hot groups are not attention specs
])
def test_kv_tp_replicas_is_filled_from_the_tp_size(case: str, replicas: int) -> None:
    inputs = _with_tp(case, 4)
    theirs = vs.run_vllm(inputs).configs[0]
    assert theirs.kv_tp_replicas == replicas
    with vs.vllm_world(vs.DEFAULT_BUILDER, inputs.shared_host_pool):
        plan = hp.plan(request_from_vllm(inputs.specs, inputs.config, inputs.available_bytes))
    interval = inputs.config.cache_config.prefix_cache_retention_interval
    ours = to_kv_cache_config(plan, inputs.specs, prefix_cache_retention_interval=interval,
                              tensor_parallel_size=4)
    assert vs.canonical(ours) == vs.canonical(theirs)
    with pytest.raises(hp.PlanError, match="tensor_parallel_size: expected a positive integer"):
        to_kv_cache_config(plan, inputs.specs, tensor_parallel_size=0)


def test_hisparse_off_cuda_answers_for_the_missing_backend() -> None:
    """Off CUDA vLLM's shared-pool question raises; inside `hisparse_off_cuda` it answers the
    given value, and the question is vLLM's own again after."""
    import importlib

    from hisparse_plan.adapters.vllm import hisparse_off_cuda

    layout: Any = importlib.import_module("vllm.v1.hisparse.layout")
    own = layout.use_shared_hisparse_host_pool
    config = vs.base_config()
    with pytest.raises(RuntimeError, match="does not support HiSparse"):
        own(config)
    for shared in (False, True):
        with hisparse_off_cuda(shared_host_pool=shared):
            assert layout.use_shared_hisparse_host_pool(config) is shared
        assert layout.use_shared_hisparse_host_pool is own
