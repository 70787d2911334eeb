"""The vLLM adapter against vLLM 0.33 itself (skipped where vLLM is not installed).

vLLM's planner runs on CPU. A venv for it (outside the repo):

    python3 -m venv ../vllm-venv && ../vllm-venv/bin/pip install torch==2.13.0
    ../vllm-venv/bin/pip install --no-deps vllm==0.33.0
    ../vllm-venv/bin/pip install packaging pydantic regex numpy cbor2 psutil pyzmq urllib3 \
        'transformers>=5.16.1,<5.21' aiohttp requests openai-harmony openai pillow pybase64 \
        cachetools msgspec cloudpickle uvloop py-cpuinfo prometheus_client xgrammar fastapi \
        partial_json_parser llguidance
    ../vllm-venv/bin/pip install -e . pytest hypothesis
    ../vllm-venv/bin/python -m pytest -q tests/test_adapter_vllm.py
"""

from __future__ import annotations

import importlib
from dataclasses import replace
from typing import Any

import pytest

pytest.importorskip("vllm")

import golden
import hisparse_plan as hp
import vllm_support as vs
from hisparse_plan.adapters.vllm import (
    BUILDER_QUALNAME,
    PLUGIN_SWITCH,
    install_builder,
    register,
    request_from_vllm,
    to_kv_cache_config,
    to_kv_cache_configs,
)
from hisparse_plan.errors import UnsupportedRequestError

kv = importlib.import_module("vllm.v1.kv_cache_interface")
planning = importlib.import_module("vllm.v1.core.kv_cache_planning")
torch = importlib.import_module("torch")

ONE_STAGE = [
    case for case in golden.CASES
    if not golden.load(case)[0]["device"].get("pipeline_stages")
    and not golden.load(case)[0]["model"].get("auto_fit_max_model_len")
]


def vllm_answer(inputs: vs.VllmInputs) -> Any:
    """vLLM's own config, or the exception it raised."""
    try:
        return vs.engine_configs(inputs)[0]
    except (ValueError, AssertionError, NotImplementedError, StopIteration) as error:
        return error


def adapter_plan(inputs: vs.VllmInputs) -> hp.KVCachePlan:
    with vs.vllm_world(vs.DEFAULT_BUILDER, inputs.shared_host_pool):
        request = request_from_vllm(inputs.specs, inputs.config, inputs.available_bytes)
    return hp.plan(request)


@pytest.mark.parametrize("case", golden.CASES)
def test_stand_in_config_reproduces_the_golden_plans(case: str) -> None:
    """vLLM's planner on the stand-in config gives the golden plan (or refuses a reject case)."""
    request, expected = golden.load(case)
    inputs = vs.vllm_inputs(request)
    if expected.get("error"):
        with pytest.raises((ValueError, AssertionError, NotImplementedError)):
            vs.run_vllm(inputs)
    else:
        assert golden.project(vs.run_view(vs.run_vllm(inputs))) == expected


def test_pipeline_stages_and_auto_fit_give_vllms_configs_per_stage() -> None:
    inputs = vs.vllm_inputs(golden.load("regular_llama3_70b_pp4_autofit")[0])
    theirs = [vs.canonical(config) for config in vs.run_vllm(inputs).configs]
    plan = hp.plan(golden.load("regular_llama3_70b_pp4_autofit")[0])
    assert [vs.canonical(c) for c in to_kv_cache_configs(plan, inputs.specs)] == theirs
    plugged = vs.run_vllm(inputs, BUILDER_QUALNAME)
    assert [vs.canonical(config) for config in plugged.configs] == theirs
    assert plugged.config.model_config.max_model_len == plan.fitted_max_model_len
    with pytest.raises(hp.PlanError, match="to_kv_cache_configs"):
        to_kv_cache_config(plan)


@pytest.mark.parametrize("case", ONE_STAGE)
def test_to_kv_cache_config_equals_vllm(case: str) -> None:
    inputs = vs.vllm_inputs(golden.load(case)[0])
    answer = vllm_answer(inputs)
    if isinstance(answer, BaseException):
        with pytest.raises(hp.PlanError):
            adapter_plan(inputs)
        return
    plan = adapter_plan(inputs)
    assert vs.canonical(to_kv_cache_config(plan, inputs.specs)) == vs.canonical(answer)
    # From the plan alone (here after a JSON round trip), without vLLM's spec objects.
    alone = hp.KVCachePlan.model_validate_json(plan.model_dump_json())
    assert vs.canonical(to_kv_cache_config(alone)) == vs.canonical(answer)


@pytest.mark.parametrize("case", ONE_STAGE)
def test_builder_plugged_in_gives_vllms_configs(case: str) -> None:
    inputs = vs.vllm_inputs(golden.load(case)[0])
    answer = vllm_answer(inputs)
    if isinstance(answer, BaseException):
        # Our PlanError, or vLLM's own admission check: nothing internal.
        refusal: ValueError | None = None
        try:
            vs.plugged_configs(inputs)
        except ValueError as error:
            refusal = error
        assert isinstance(refusal, hp.PlanError) or "To serve at least one" in str(refusal)
        return
    plugged = vs.plugged_configs(inputs)
    assert [vs.canonical(config) for config in plugged] == [vs.canonical(answer)]


@pytest.mark.parametrize("case", ONE_STAGE)
@pytest.mark.parametrize("num_blocks", [1, 7])
def test_builder_places_any_block_count_as_vllm(case: str, num_blocks: int) -> None:
    """Probes and profiling ask for a few blocks: placed without admission, as vLLM does."""
    inputs = vs.vllm_inputs(golden.load(case)[0])
    if isinstance(vllm_answer(inputs), BaseException):
        pytest.skip("vLLM refuses this request")
    with vs.vllm_world(vs.DEFAULT_BUILDER, inputs.shared_host_pool):
        groups = planning.get_global_kv_cache_groups(inputs.config, [dict(inputs.specs)])
        theirs = planning.DefaultKVCacheConfigBuilder().get_kv_cache_config_from_groups(
            inputs.config, groups, num_blocks
        )
        builder = importlib.import_module("hisparse_plan.adapters.vllm.builder")
        ours = builder.HisparsePlanKVCacheConfigBuilder().get_kv_cache_config_from_groups(
            inputs.config, groups, num_blocks
        )
    assert vs.canonical(ours) == vs.canonical(theirs)


def test_install_builder_makes_vllm_resolve_it() -> None:
    resolve = importlib.import_module("vllm.v1.core.kv_cache_config_builder")
    inputs = vs.vllm_inputs(golden.load("regular_llama3_8b_bf16")[0])
    with vs.vllm_world(vs.DEFAULT_BUILDER, False):
        install_builder()
        builder = resolve.get_kv_cache_config_builder(inputs.config)
    assert f"{type(builder).__module__}.{type(builder).__name__}" == BUILDER_QUALNAME


def test_plugin_hook_installs_the_builder_only_when_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    resolve = importlib.import_module("vllm.v1.core.kv_cache_config_builder")
    inputs = vs.vllm_inputs(golden.load("regular_llama3_8b_bf16")[0])
    with vs.vllm_world(vs.DEFAULT_BUILDER, False):
        monkeypatch.delenv(PLUGIN_SWITCH, raising=False)
        register()
        assert type(resolve.get_kv_cache_config_builder(inputs.config)).__name__ == (
            "DefaultKVCacheConfigBuilder"
        )
        monkeypatch.setenv(PLUGIN_SWITCH, "1")
        register()
        builder = resolve.get_kv_cache_config_builder(inputs.config)
    assert f"{type(builder).__module__}.{type(builder).__name__}" == BUILDER_QUALNAME


def _gemma_like() -> vs.VllmInputs:
    return vs.vllm_inputs(golden.load("hisparse_hybrid_swa_full")[0])


def test_host_budget_is_read_from_vllms_connector_unless_given() -> None:
    inputs = _gemma_like()
    read = adapter_plan(inputs)
    with vs.vllm_world(vs.DEFAULT_BUILDER, False):
        given = request_from_vllm(inputs.specs, inputs.config, inputs.available_bytes, 3 * 2**30)
    assert read.host_pool is not None
    assert read.host_pool.budget_bytes == 4 * 2**30
    assert given.hisparse is not None
    assert given.hisparse.host_pool_gib == 3.0


def test_sliding_windows_tagged_by_the_engine_map_like_untagged_ones() -> None:
    inputs = _gemma_like()  # num_prefill_lookahead_tokens 3: the engine tags 2 extra tokens
    tagged = {
        name: replace(spec, extra_retained_tokens=2) if isinstance(spec, kv.SlidingWindowSpec)
        else spec
        for name, spec in inputs.specs.items()
    }
    with vs.vllm_world(vs.DEFAULT_BUILDER, False):
        plain = request_from_vllm(inputs.specs, inputs.config, inputs.available_bytes)
        from_tagged = request_from_vllm(tagged, inputs.config, inputs.available_bytes)
        wrong = {**tagged, "model.local.0.attn": replace(
            tagged["model.local.0.attn"], extra_retained_tokens=5
        )}
        with pytest.raises(UnsupportedRequestError, match=r"model\.local\.0\.attn.*extra_retained"):
            request_from_vllm(wrong, inputs.config, inputs.available_bytes)
    assert plain == from_tagged


def _full(**changes: Any) -> Any:
    fields: dict[str, Any] = {
        "block_size": 16, "num_kv_heads": 8, "head_size": 128, "dtype": torch.bfloat16,
    }
    return kv.FullAttentionSpec(**(fields | changes))


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        (kv.CrossAttentionSpec(block_size=16, num_kv_heads=8, head_size=128,
                               dtype=torch.bfloat16), "CrossAttentionSpec is not supported"),
        (kv.CircularBufferSpec(block_size=16, num_kv_heads=1, head_size=128,
                               dtype=torch.bfloat16), "CircularBufferSpec is not supported"),
        (_full(num_head_slots=4), "num_head_slots"),
        (_full(attention_chunk_size=64), "attention_chunk_size"),
        (_full(dtype=torch.float64), "dtype"),
        (_full(block_stride_alignment=importlib.import_module(
            "vllm.v1.attention.backend").MultipleOf(16)), "kernel blocks"),
    ],
)
def test_unsupported_specs_are_refused_naming_the_layer(spec: Any, match: str) -> None:
    inputs = vs.vllm_inputs(golden.load("regular_llama3_8b_bf16")[0])
    specs = {**inputs.specs, "model.odd.attn": spec}
    with pytest.raises(UnsupportedRequestError, match=rf"layers\['model\.odd\.attn'\].*{match}"):
        request_from_vllm(specs, inputs.config, inputs.available_bytes)


def test_layers_differing_only_in_a_field_the_contract_lacks_are_refused() -> None:
    inputs = vs.vllm_inputs(golden.load("regular_llama3_8b_bf16")[0])
    first = next(iter(inputs.specs))
    specs = {**inputs.specs, first: replace(inputs.specs[first], max_tp_shards=2)}
    with pytest.raises(UnsupportedRequestError, match="max_tp_shards"):
        request_from_vllm(specs, inputs.config, inputs.available_bytes)


def test_deferred_engine_modes_are_refused() -> None:
    inputs = vs.vllm_inputs(golden.load("regular_llama3_8b_bf16")[0])
    inputs.config.scheduler_config.disable_hybrid_kv_cache_manager = True
    with pytest.raises(UnsupportedRequestError, match="disable_hybrid_kv_cache_manager"):
        request_from_vllm(inputs.specs, inputs.config, inputs.available_bytes)
