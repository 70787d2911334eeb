"""The vLLM adapter against vLLM itself, 0.33 or 0.34 (skipped where vLLM is not installed).

vLLM's planner runs on CPU, on a real `VllmConfig` of the installed version (see `vllm_support`
for how one is built on a CPU-only machine: the CPU platform, and vLLM 0.34's Triton check
satisfied while the config is built). A venv for it (outside the repo), for 0.34 or 0.33:

    python3 -m venv ../vllm-venv && ../vllm-venv/bin/pip install torch==2.13.0
    ../vllm-venv/bin/pip install --no-deps vllm==0.34.0      # or vllm==0.33.0
    ../vllm-venv/bin/pip install packaging pydantic regex numpy cbor2 psutil pyzmq urllib3 \
        'transformers>=5.16.1,<5.21' aiohttp requests openai-harmony openai pillow pybase64 \
        cachetools msgspec cloudpickle uvloop py-cpuinfo prometheus_client xgrammar fastapi \
        partial_json_parser llguidance einops loguru
    ../vllm-venv/bin/pip install --no-deps compressed-tensors  # model classes (--specs-from-vllm)
    ../vllm-venv/bin/pip install -e . pytest hypothesis
    ../vllm-venv/bin/python -m pytest -q tests/adapters/test_adapter_vllm.py
"""

from __future__ import annotations

import importlib
from dataclasses import replace
from typing import Any

import pytest

pytest.importorskip("vllm")

import hisparse_plan as hp
from hisparse_plan.adapters.vllm import (
    BUILDER_QUALNAME,
    PLUGIN_SWITCH,
    install_builder,
    register,
    request_dict,
    request_from_vllm,
    to_kv_cache_config,
    to_kv_cache_configs,
)
from hisparse_plan.adapters.vllm.settings import settings_from_vllm
from hisparse_plan.errors import UnsupportedRequestError
from support import golden
from support import vllm_support as vs

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


def case_inputs(case: str) -> vs.VllmInputs:
    """vLLM's inputs for a golden case, skipped where the installed vLLM cannot express it."""
    request = golden.load(case)[0]
    reason = vs.inexpressible(request)
    if reason is not None:
        pytest.skip(reason)
    return vs.vllm_inputs(request)


def retention(inputs: vs.VllmInputs) -> int | None:
    """The engine's prefix_cache_retention_interval, which a KVCacheConfig carries."""
    interval: int | None = inputs.config.cache_config.prefix_cache_retention_interval
    return interval


def adapter_plan(inputs: vs.VllmInputs) -> hp.KVCachePlan:
    with vs.vllm_world(vs.DEFAULT_BUILDER, inputs.shared_host_pool):
        request = request_from_vllm(inputs.specs, inputs.config, inputs.available_bytes)
    return hp.plan(request)


@pytest.mark.parametrize("case", golden.CASES)
def test_vllm_reproduces_the_golden_plans(case: str) -> None:
    """vLLM's planner on a real config gives the golden plan (or refuses a reject case)."""
    expected = golden.load(case)[1]
    inputs = case_inputs(case)
    if expected.get("error"):
        with pytest.raises((ValueError, AssertionError, NotImplementedError)):
            vs.run_vllm(inputs)
    else:
        assert golden.project(vs.run_view(vs.run_vllm(inputs))) == expected


def test_pipeline_stages_and_auto_fit_give_vllms_configs_per_stage() -> None:
    inputs = vs.vllm_inputs(golden.load("regular_llama3_70b_pp4_autofit")[0])
    theirs = [vs.canonical(config) for config in vs.run_vllm(inputs).configs]
    plan = hp.plan(golden.load("regular_llama3_70b_pp4_autofit")[0])
    interval = retention(inputs)
    ours = to_kv_cache_configs(plan, inputs.specs, prefix_cache_retention_interval=interval)
    assert [vs.canonical(config) for config in ours] == theirs
    plugged = vs.run_vllm(inputs, BUILDER_QUALNAME)
    assert [vs.canonical(config) for config in plugged.configs] == theirs
    assert plugged.config.model_config.max_model_len == plan.fitted_max_model_len
    with pytest.raises(hp.PlanError, match="to_kv_cache_configs"):
        to_kv_cache_config(plan)


@pytest.mark.parametrize("case", ONE_STAGE)
def test_to_kv_cache_config_equals_vllm(case: str) -> None:
    inputs = case_inputs(case)
    answer = vllm_answer(inputs)
    if isinstance(answer, BaseException):
        with pytest.raises(hp.PlanError):
            adapter_plan(inputs)
        return
    plan = adapter_plan(inputs)
    interval = retention(inputs)
    ours = to_kv_cache_config(plan, inputs.specs, prefix_cache_retention_interval=interval)
    assert vs.canonical(ours) == vs.canonical(answer)
    # From the plan alone (here after a JSON round trip), without vLLM's spec objects.
    alone = hp.KVCachePlan.model_validate_json(plan.model_dump_json())
    from_plan = to_kv_cache_config(alone, prefix_cache_retention_interval=interval)
    assert vs.canonical(from_plan) == vs.canonical(answer)


@pytest.mark.parametrize("case", ONE_STAGE)
def test_builder_plugged_in_gives_vllms_configs(case: str) -> None:
    inputs = case_inputs(case)
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
    inputs = case_inputs(case)
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


def test_engine_modes_map_to_the_request() -> None:
    """Align mode, the hybrid manager switched off and decode context parallelism are read from
    the engine's config into the request's fields."""
    inputs = vs.vllm_inputs(golden.load("regular_llama3_8b_bf16")[0])
    inputs.config.cache_config.mamba_cache_mode = "align"
    inputs.config.scheduler_config.disable_hybrid_kv_cache_manager = True
    inputs.config.parallel_config.decode_context_parallel_size = 4
    settings = settings_from_vllm(inputs.config)
    assert (settings.mamba_cache_mode, settings.disable_hybrid_kv_cache_manager,
            settings.decode_context_parallel_size) == ("align", True, 4)
    data = request_dict(inputs.specs, settings, inputs.available_bytes)
    assert data["model"]["mamba_cache_mode"] == "align"  # type: ignore[index]
    assert data["scheduler"]["disable_hybrid_kv_cache_manager"] is True  # type: ignore[index]
    assert data["scheduler"]["decode_context_parallel_size"] == 4  # type: ignore[index]


def test_engine_modes_still_deferred_are_refused_naming_the_field() -> None:
    inputs = vs.vllm_inputs(golden.load("regular_llama3_8b_bf16")[0])
    inputs.config.cache_config.mamba_cache_mode = "all"
    with pytest.raises(UnsupportedRequestError, match=r"mamba_cache_mode.*'all'"):
        request_from_vllm(inputs.specs, inputs.config, inputs.available_bytes)


def test_decode_query_len_is_vllms_own() -> None:
    """1 + K on 0.33; 0.34 adds the drafter's extra slots (max_num_new_slots_for_drafting)."""
    inputs = vs.vllm_inputs(golden.load("deepseek_v32_fp8_mtp3_shared_pool")[0])
    inputs.config.speculative_config = vs.Speculative(2, max_num_new_slots_for_drafting=1)
    with vs.vllm_world(vs.DEFAULT_BUILDER, inputs.shared_host_pool):
        settings = settings_from_vllm(inputs.config)
    assert settings.hisparse is not None
    assert settings.hisparse.max_decode_query_len == (4 if vs.IS_034 else 3)


def test_host_budget_goes_through_vllms_planner_binding(monkeypatch: pytest.MonkeyPatch) -> None:
    """A patch of the name vLLM's planner calls reaches the adapter and the builder alike."""
    inputs = _gemma_like()
    monkeypatch.setattr(planning, "get_hisparse_host_pool_bytes", lambda config: 3 * 2**30)
    with vs.vllm_world(vs.DEFAULT_BUILDER, False):
        settings = settings_from_vllm(inputs.config)
        groups = planning.get_global_kv_cache_groups(inputs.config, [dict(inputs.specs)])
    assert settings.hisparse is not None
    assert settings.hisparse.host_pool_bytes == 3 * 2**30
    builder = importlib.import_module("hisparse_plan.adapters.vllm.builder")
    with vs.vllm_world(vs.DEFAULT_BUILDER, False):
        ours = builder.HisparsePlanKVCacheConfigBuilder().get_kv_cache_config_from_groups(
            inputs.config, groups, 7
        )
        theirs = planning.DefaultKVCacheConfigBuilder().get_kv_cache_config_from_groups(
            inputs.config, groups, 7
        )
    assert ours.hisparse_host_num_blocks == theirs.hisparse_host_num_blocks
    assert ours.hisparse_host_num_blocks < 12_787  # the 4 GiB budget's figure


def test_pipeline_workers_share_kv_cache_zeroing() -> None:
    """One stage's Mamba layer makes every stage zero new blocks (0.34 ORs the workers' answers;
    0.33's per-config answer already sees the Mamba group, empty on the first stage)."""
    request = golden.load("regular_llama3_8b_bf16")[0]
    names = list(request["layers"])
    request["layers"][names[-1]] = {  # a Mamba mixer with the attention layers' 65,536 B page
        "kind": "mamba", "block_size": request["model"]["max_model_len"],
        "state_shapes": [[128, 256]], "state_dtypes": ["bfloat16"],
    }
    memory = request["device"]["available_bytes"] // 2
    request["device"]["pipeline_stages"] = [
        {"layers": names[:16], "available_bytes": memory},
        {"layers": names[16:], "available_bytes": memory},
    ]
    inputs = vs.vllm_inputs(request)
    theirs = vs.run_vllm(inputs).configs
    interval = retention(inputs)
    ours = to_kv_cache_configs(
        hp.plan(request), inputs.specs, prefix_cache_retention_interval=interval
    )
    assert [vs.canonical(config) for config in ours] == [vs.canonical(c) for c in theirs]
    assert [c.needs_kv_cache_zeroing for c in ours] == [c.needs_kv_cache_zeroing for c in theirs]
    assert [c.needs_kv_cache_zeroing for c in ours] == [True, True]


@pytest.mark.skipif(vs.IS_034, reason="vLLM 0.34's MambaSpec has state_alignment")
def test_state_alignment_is_refused_by_vllm_033_naming_the_field() -> None:
    plan = hp.plan(golden.load("modes_mamba_state_alignment")[0])
    with pytest.raises(hp.PlanError, match=r"state_alignment.*expected 1, got 16"):
        to_kv_cache_configs(plan)
