"""Regular presets: each `regular_*` golden case, asked for by name on the command line,
gives exactly the golden request and plan."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

import hisparse_plan as hp
from hisparse_plan.presets import (
    ConfigError,
    RegularArchitecture,
    Settings,
    build_request,
    load_preset,
    pp_partition,
    preset_names,
)
from support.cli_support import Run
from support.golden import load, project

GIB = 2**30

# case -> the command-line words after `plan`: a preset and the case's memory, length, layout.
# The regular_* cases are vLLM 0.33's plans in the modes of that round (prefix caching off for
# Qwen3-Next, the hybrid manager kept for Llama-4); modes_llama4 is vLLM's default for Llama-4.
V033 = ["--vllm", "0.33"]
CASES: dict[str, list[str]] = {
    "regular_llama3_8b_bf16": ["llama-3-8b", "--gpu-mem", "60GiB", "--max-model-len", "8192",
                               *V033],
    "regular_gemma3_27b_swa": ["gemma-3-27b", "--gpu-mem", "40GiB", "--max-model-len", "131072",
                               *V033],
    "regular_gpt_oss_120b": ["gpt-oss-120b", "--gpu-mem", "60GiB", "--max-model-len", "131072",
                             *V033],
    "regular_llama4_scout_chunked_local": [
        "llama-4-scout", "--gpu-mem", "60GiB", "--max-model-len", "262144", *V033,
        "--enable-hybrid-kv-cache-manager",
    ],
    "modes_llama4_scout_hybrid_manager_off": [
        "llama-4-scout", "--gpu-mem", "60GiB", "--max-model-len", "131072", *V033,
    ],
    "regular_qwen3_next_80b_mamba": [
        "qwen3-next-80b", "--gpu-mem", "60GiB", "--max-model-len", "262144", *V033,
        "--no-enable-prefix-caching",
    ],
    "regular_deepseek_v32_no_hisparse_lbnhc": [
        "deepseek-v3.2", "--no-hisparse", "--gpu-mem", "64424509440", "--max-model-len",
        "163840", "--layout", "LBNHC",
    ],
    "regular_llama3_70b_pp4_autofit": [
        "llama-3-70b", "--pp", "4", "--stage-gpu-mem", "9GiB,10GiB,10GiB,12GiB",
        "--max-model-len", "131072", "--auto-fit", *V033,
    ],
    "regular_reject_llama3_70b_too_little_memory": [
        "llama-3-70b", "--gpu-mem", "8GiB", "--max-model-len", "131072", *V033,
    ],
}


def _layout(case: str) -> list[str]:
    request, _ = load(case)
    return ["--layout", request["device"]["kv_cache_layout"]]


@pytest.mark.parametrize("case", sorted(CASES))
def test_plan_by_name_is_the_golden_plan(case: str, cli: Run) -> None:
    golden_request, expected = load(case)
    argv = CASES[case] if "--layout" in CASES[case] else CASES[case] + _layout(case)
    code, out, err = cli("plan", *argv, "--json")
    if expected.get("error"):
        assert code == 2
        assert err.startswith("error: ")
        return
    assert code == 0, err
    plan = hp.KVCachePlan.model_validate_json(out)
    assert project(plan.model_dump(mode="json")) == expected
    hp.check_plan(plan)
    assert plan == hp.plan(hp.PlanRequest.model_validate(golden_request))


@pytest.mark.parametrize("case", sorted(c for c in CASES if "reject" not in c))
def test_preset_request_is_the_golden_request(case: str) -> None:
    golden_request, _ = load(case)
    argv = CASES[case]
    settings = Settings(
        gpu_mem_bytes=None if "--pp" in argv else hp.PlanRequest.model_validate(
            golden_request).device.available_bytes,
        max_model_len=golden_request["model"]["max_model_len"],
        hisparse=False if "--no-hisparse" in argv else None,
        layout=hp.KVCacheLayout(golden_request["device"]["kv_cache_layout"]),
        pp=4 if "--pp" in argv else None,
        stage_gpu_mem_bytes=(9 * GIB, 10 * GIB, 10 * GIB, 12 * GIB) if "--pp" in argv else None,
        auto_fit=True if "--auto-fit" in argv else None,
        vllm="0.33" if "0.33" in argv else None,
        prefix_caching=False if "--no-enable-prefix-caching" in argv else None,
        hybrid_kv_cache_manager=True if "--enable-hybrid-kv-cache-manager" in argv else None,
    )
    request = build_request(load_preset(argv[0]).architecture, settings)
    assert request == hp.PlanRequest.model_validate(golden_request)


@pytest.mark.parametrize(("layers", "pp", "sizes"), [
    (80, 4, [20, 20, 20, 20]),
    (61, 4, [15, 15, 16, 15]),
    (62, 4, [15, 16, 16, 15]),
    (63, 4, [16, 16, 16, 15]),
    (5, 5, [1, 1, 1, 1, 1]),
    (7, 1, [7]),
])
def test_pp_partition_is_vllms(layers: int, pp: int, sizes: list[int]) -> None:
    # vLLM's get_pp_indices: the remainder goes to the stages just before the last.
    assert pp_partition(layers, pp) == sizes


@pytest.mark.parametrize("pp", [0, 81])
def test_pp_beyond_the_layers_is_refused(pp: int) -> None:
    with pytest.raises(ConfigError, match="pipeline stages: expected between 1 and"):
        pp_partition(80, pp)


def test_qwen3_next_block_size_is_vllms_alignment() -> None:
    arch = load_preset("qwen3-next-80b").architecture
    old = Settings(max_model_len=4096, vllm="0.33", prefix_caching=False)
    request = build_request(arch, old)
    specs = {spec.kind: spec for spec in request.layers.values()}
    # ceil(1,097,728 / (16 * 2048)) * 16 = 544 tokens; the Mamba page padded to 544 * 2048.
    assert specs["full_attention"].block_size == 544
    assert specs["mamba"].block_size == 4096
    assert specs["mamba"].page_size_bytes == 544 * 2048
    assert request.model.mamba_cache_mode == "none"
    # With TP 2 each rank keeps half the states and one KV head: the alignment follows.
    halved = build_request(arch, Settings(max_model_len=4096, tp=2, vllm="0.33",
                                          prefix_caching=False))
    half = {spec.kind: spec for spec in halved.layers.values()}
    assert half["full_attention"].num_kv_heads == 1  # type: ignore[union-attr]
    assert half["full_attention"].block_size == 16 * -(-548864 // (16 * 1024))


@pytest.mark.parametrize("version", ["0.33", "0.34"])
def test_qwen3_next_by_default_runs_in_align_mode(version: str) -> None:
    """Prefix caching on (vLLM's default): align mode, the Mamba block is the attention block,
    and FlashInfer's checkpoint grid of 64 tokens gives 64 * ceil(1,097,728 / (64 * 2048)) =
    576 tokens on either version; one prefill checkpoint block per Mamba layer."""
    arch = load_preset("qwen3-next-80b").architecture
    request = build_request(arch, Settings(max_model_len=4096, vllm=version))  # type: ignore[arg-type]
    specs = {spec.kind: spec for spec in request.layers.values()}
    mamba = specs["mamba"]
    assert isinstance(mamba, hp.MambaSpec)
    assert request.model.mamba_cache_mode == "align"
    assert specs["full_attention"].block_size == mamba.block_size == 576
    assert mamba.page_size_bytes == 576 * 2048
    assert (mamba.num_prefill_checkpoint_blocks, mamba.prefill_checkpoint_alignment) == (1, 576)
    plan = hp.plan(request)
    mamba_groups = [g for g in plan.groups if g.spec.kind == "mamba"]
    assert mamba_groups
    # 2 state blocks + 1 checkpoint per Mamba group, ceil(4096 / 576) for the attention group
    assert sum(1 for _ in mamba_groups) * 3 + 8 == plan.num_blocks / plan.capacity.max_concurrency


def test_regular_settings_that_do_not_apply_are_refused() -> None:
    arch = load_preset("llama-3-8b").architecture
    for settings, field in (
        (Settings(kv_dtype="fp8_ds_mla"), "kv_dtype"),
        (Settings(host_pool_bytes=GIB), "host_pool_bytes"),
        (Settings(hisparse=True), "hisparse"),
        (Settings(speculative="mtp"), "speculative"),
        (Settings(tp=3), "tp"),
        (Settings(max_model_len=8193), "model.max_model_len"),
        (Settings(pp=2, stage_gpu_mem_bytes=(GIB,)), "device.pipeline_stages"),
    ):
        with pytest.raises(ConfigError) as refused:
            build_request(arch, settings)
        assert refused.value.field == field


def test_regular_architecture_checks_its_fields() -> None:
    base = {"num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
            "hidden_size": 512, "max_position_embeddings": 4096}
    assert RegularArchitecture.model_validate(base).layer_kinds() == ["full"] * 4
    for extra, message in (
        ({"layer_types": ["full_attention"]}, "an entry for each of the 4 layers"),
        ({"layer_types": []}, "an entry for each of the 4 layers, got 0"),
        ({"layer_types": ["cross_attention"] * 4}, "got cross_attention"),
        ({"sliding_window_pattern": 2}, "sliding_window"),
        ({"full_attention_interval": 2}, "linear_num_key_heads"),
    ):
        with pytest.raises(ValueError, match=message):
            RegularArchitecture.model_validate({**base, **extra})


def test_regular_plan_summary(cli: Run) -> None:
    code, out, err = cli("plan", "gemma-3-27b", "--gpu-mem", "40GiB", "--plain", "--vllm", "0.33")
    assert code == 0, err
    assert out.startswith(
        "Gemma-3-27B (vLLM 0.33 defaults, hybrid KV cache manager on): no HiSparse, block 16, "
        "max_model_len 131072, BLNHC")
    assert "sliding_window x6" in out
    assert "32768 blocks / 11654 blocks per request" in out
    code, out, err = cli("plan", "llama-3-70b", "--pp", "4", "--stage-gpu-mem",
                         "9GiB,10GiB,10GiB,12GiB", "--max-model-len", "131072", "--auto-fit",
                         "--plain", "--vllm", "0.33")
    assert code == 0, err
    assert "max_model_len 117936 (auto-fit from 131072)" in out
    assert [line.split()[:2] for line in out.splitlines() if line.startswith("stage 3")] == [
        ["stage", "3"], ["stage", "3"],
    ]
    json.dumps(out)


@pytest.mark.parametrize(("name", "layers"), [("deepseek-v3.2", 61), ("glm-5", 78)])
def test_no_hisparse_plans_every_cache_as_a_regular_mla_layer(name: str, layers: int) -> None:
    request = build_request(load_preset(name).architecture,
                            Settings(hisparse=False, max_model_len=32768))
    assert request.hisparse is None
    assert request.model.index_topk is None
    assert len(request.layers) == 2 * layers
    plan = hp.plan(request)
    assert plan.host_pool is None
    # One uniform_type group: 656-byte latent rows and 132-byte indexer rows, 64-token blocks.
    assert [group.spec.page_size_bytes for group in plan.groups] == [layers * 64 * (656 + 132)]
    with pytest.raises(ConfigError, match="host_pool_bytes: a HiSparse setting"):
        build_request(load_preset(name).architecture,
                      Settings(hisparse=False, host_pool_bytes=GIB))


def test_hf_config_of_a_regular_model(cli: Run, tmp_path: Path) -> None:
    # Gemma 3's multimodal config keeps the language model under text_config.
    config = {"architectures": ["Gemma3ForConditionalGeneration"],
              "text_config": load_preset("gemma-3-27b").architecture.model_dump(exclude_none=True)}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    code, out, err = cli("plan", "--hf-config", str(path), "--gpu-mem", "40GiB", "--json",
                         "--vllm", "0.33")
    assert code == 0, err
    assert project(json.loads(out)) == load("regular_gemma3_27b_swa")[1]
    path.write_text(json.dumps({"num_hidden_layers": 4, "hidden_size": 64}))
    code, _, err = cli("plan", "--hf-config", str(path))
    assert code == 2
    assert f"{path}: num_attention_heads: missing; expected in a model's config.json" in err


@hypothesis_settings(max_examples=40, deadline=None)
@given(
    name=st.sampled_from([n for n in preset_names() if n != "glm-5-index-share-4"]),
    tp=st.sampled_from([1, 2, 4, 8]),
    pp=st.integers(1, 4),
    length=st.integers(1, 2**18),
    gib=st.integers(1, 80),
    layout=st.sampled_from(list(hp.KVCacheLayout)),
    hisparse=st.booleans(),
)
def test_any_preset_setting_plans_soundly_or_is_refused(
    name: str, tp: int, pp: int, length: int, gib: int, layout: hp.KVCacheLayout, hisparse: bool
) -> None:
    """Nothing but a PlanError comes out of a preset and its settings, and every plan that does
    passes check_plan."""
    preset = load_preset(name)
    chosen = Settings(tp=tp, pp=pp, max_model_len=length, gpu_mem_bytes=gib * GIB,
                      layout=layout, allow_long_context=True,
                      hisparse=None if hisparse or preset.sparse_architecture is None else False)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", hp.PlanWarning)
            plan = hp.plan(build_request(preset.architecture, chosen))
    except hp.PlanError:
        return
    hp.check_plan(plan)
    assert len(plan.device_pools) == pp
