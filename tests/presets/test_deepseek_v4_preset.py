"""The `deepseek-v4-flash` preset: the caches vLLM 0.33 registers for DeepSeek-V4-Flash, read
from the model's config.json fields, and the settings it cannot take."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import hisparse_plan as hp
from hisparse_plan.presets import (
    ConfigError,
    RegularArchitecture,
    Settings,
    build_request,
    load_preset,
)
from support.cli_support import Run

GIB = 2**30
AT_64K = Settings(max_model_len=65536)
V4_TYPES = {0: "sliding_attention", 4: "compressed_sparse_attention",
            128: "heavily_compressed_attention"}


def _config() -> dict[str, Any]:
    return load_preset("deepseek-v4-flash").architecture.model_dump(exclude_none=True)


def _request(settings: Settings = AT_64K) -> hp.PlanRequest:
    return build_request(load_preset("deepseek-v4-flash").architecture, settings)


def test_layers_are_vllms_names_in_its_order() -> None:
    names = list(_request().layers)
    assert len(names) == 2 + 21 * 5 + 20 * 3
    assert names[:12] == [
        "model.layers.0.attn.swa_cache",
        "model.layers.1.attn.swa_cache",
        "model.layers.2.attn.indexer.k_cache",
        "model.layers.2.attn.indexer.compressor.state_cache",
        "model.layers.2.attn.swa_cache",
        "model.layers.2.attn",
        "model.layers.2.attn.compressor.state_cache",
        "model.layers.3.attn.swa_cache",
        "model.layers.3.attn",
        "model.layers.3.attn.compressor.state_cache",
        "model.layers.4.attn.indexer.k_cache",
        "model.layers.4.attn.indexer.compressor.state_cache",
    ]
    assert names[-5:] == [
        "model.layers.42.attn.indexer.k_cache",
        "model.layers.42.attn.indexer.compressor.state_cache",
        "model.layers.42.attn.swa_cache",
        "model.layers.42.attn",
        "model.layers.42.attn.compressor.state_cache",
    ]


@pytest.mark.parametrize(("name", "kind", "block", "window", "page"), [
    # 64 x 584-byte rows = 37376, padded to 65 x 576
    ("model.layers.0.attn.swa_cache", "sliding_window_mla", 64, 128, 37440),
    # 256 / 4 = 64 rows of 132 bytes = 8448 -> 8640
    ("model.layers.2.attn.indexer.k_cache", "mla", 256, None, 8640),
    # 4 tokens x (2 x 2 x 128) float32 = 8192 -> 8640
    ("model.layers.2.attn.indexer.compressor.state_cache", "sliding_window_mla", 4, 8, 8640),
    ("model.layers.2.attn", "mla", 256, None, 37440),
    # 4 tokens x (2 x 2 x 512) float32 = 32768 -> 32832
    ("model.layers.2.attn.compressor.state_cache", "sliding_window_mla", 4, 8, 32832),
    # 256 / 128 = 2 rows of 584 = 1168 -> 1728
    ("model.layers.3.attn", "mla", 256, None, 1728),
    # 8 tokens x (2 x 1 x 512) float32 = 32768 -> 32832
    ("model.layers.3.attn.compressor.state_cache", "sliding_window_mla", 8, 128, 32832),
])
def test_each_cache_is_vllms_spec(
    name: str, kind: str, block: int, window: int | None, page: int
) -> None:
    spec = _request().layers[name]
    assert (spec.kind, spec.block_size, getattr(spec, "sliding_window", None)) == (
        kind, block, window)
    assert spec.page_size_bytes == page


def test_layer_types_read_like_compress_ratios() -> None:
    """transformers turns the checkpoint's compress_ratios into layer_types; vLLM reads those."""
    config = _config()
    ratios = config.pop("compress_ratios")
    config["layer_types"] = [V4_TYPES[ratio] for ratio in ratios[:43]]
    arch = RegularArchitecture.model_validate(config)
    assert build_request(arch, Settings(max_model_len=65536)) == _request()


def test_defaults_plan_soundly() -> None:
    request = _request(Settings())
    assert request.model.max_model_len == 1048576
    plan = hp.plan(request)
    hp.check_plan(plan, request=request)


@pytest.mark.parametrize(("settings", "field"), [
    (Settings(kv_dtype="bfloat16"), "kv_dtype"),
    (Settings(block_size=64), "block_size"),
    (Settings(hisparse=True), "hisparse"),
    (Settings(speculative="mtp"), "speculative"),
    (Settings(tp=3), "tp"),
])
def test_settings_it_cannot_take_are_refused(settings: Settings, field: str) -> None:
    with pytest.raises(ConfigError) as refused:
        _request(settings)
    assert refused.value.field == field


@pytest.mark.parametrize(("change", "message"), [
    ({"compress_ratios": None}, "compress_ratios: a DeepSeek-V4 config needs it or layer_types"),
    ({"compress_ratios": [0] * 42}, "an entry for each of the 43 layers, got 42"),
    ({"compress_ratios": []}, "an entry for each of the 43 layers, got 0"),
    ({"compress_ratios": [0, 2] * 22}, "expected 0, 4 or 128 .* got 2"),
    ({"layer_types": ["full_attention"] * 43}, "layer_types: expected sliding_attention"),
    ({"index_head_dim": None}, "index_head_dim: ratio-4 layers have an indexer"),
    ({"sliding_window": None}, "sliding_window: a DeepSeek-V4 config needs it"),
])
def test_bad_configs_name_the_field(change: dict[str, Any], message: str) -> None:
    config = {key: value for key, value in {**_config(), **change}.items() if value is not None}
    with pytest.raises(ValueError, match=message):
        RegularArchitecture.model_validate(config)


@pytest.mark.parametrize(("change", "field"), [
    ({"head_dim": 256}, "head_dim"),
    ({"index_head_dim": 100}, "index_head_dim"),
])
def test_geometry_vllm_does_not_build_is_refused(change: dict[str, Any], field: str) -> None:
    arch = RegularArchitecture.model_validate({**_config(), **change})
    with pytest.raises(ConfigError) as refused:
        build_request(arch, Settings(max_model_len=65536))
    assert refused.value.field == field


def test_hf_config_plans_like_the_preset(cli: Run, tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"architectures": ["DeepseekV4ForCausalLM"], **_config()}))
    words = ["--gpu-mem", "60GiB", "--max-model-len", "65536", "--json"]
    code, by_file, err = cli("plan", "--hf-config", str(path), *words)
    assert code == 0, err
    code, by_name, err = cli("plan", "deepseek-v4-flash", *words)
    assert code == 0, err
    assert json.loads(by_file) == json.loads(by_name)


# vLLM 0.33's own planner (get_global_kv_cache_groups, then get_kv_cache_configs; BLNHC, 60 GiB,
# max_model_len 65536, 8192 batched tokens) on the 167 specs its DeepSeek-V4 modules register
# for DeepSeek-V4-Flash (references/vllm_v4_flash.py derives them and runs it again):
# five packed uniform_type groups, as (block size, page bytes, layers, first layer) ...
VLLM_GROUPS = [
    (64, 823680, 22, "model.layers.0.attn.swa_cache"),
    (64, 786240, 21, "model.layers.1.attn.swa_cache"),
    (256, 1002240, 62, "model.layers.2.attn.indexer.k_cache"),
    (4, 870912, 42, "model.layers.2.attn.indexer.compressor.state_cache"),
    (8, 656640, 20, "model.layers.3.attn.compressor.state_cache"),
]
# ... its KVCacheTensors, as (layers, first layer, layer_stride, block_stride, offset) ...
VLLM_TENSORS = [
    (22, "model.layers.0.attn.swa_cache", 37440, 1002240, 0),
    (21, "model.layers.1.attn.swa_cache", 37440, 1002240, 0),
    (21, "model.layers.2.attn.indexer.k_cache", 8640, 1002240, 0),
    (21, "model.layers.2.attn", 37440, 1002240, 181440),
    (20, "model.layers.3.attn", 1728, 1002240, 967680),
    (21, "model.layers.2.attn.indexer.compressor.state_cache", 8640, 1002240, 0),
    (21, "model.layers.2.attn.compressor.state_cache", 32832, 1002240, 181440),
    (20, "model.layers.3.attn.compressor.state_cache", 32832, 1002240, 0),
]
# ... and its pool: num_blocks, bytes per block, and get_max_concurrency_for_kv_cache_config.
VLLM_NUM_BLOCKS, VLLM_BYTES_PER_BLOCK, VLLM_MAX_CONCURRENCY = 64280, 1002240, 17.806094


def test_plan_by_name_is_vllms_plan(cli: Run) -> None:
    code, out, err = cli("plan", "deepseek-v4-flash", "--gpu-mem", "60GiB", "--max-model-len",
                         "65536", "--json")
    assert code == 0, err
    plan = json.loads(out)
    assert [(g["spec"]["kind"], g["spec"]["block_size"], g["spec"]["page_size_bytes"],
             len(g["layer_names"]), g["layer_names"][0]) for g in plan["groups"]] == [
        ("uniform_type", *group) for group in VLLM_GROUPS]
    assert [(len(t["layers"]), t["layers"][0], t["layer_stride"], t["block_stride"], t["offset"])
            for t in plan["tensors"]] == VLLM_TENSORS
    assert plan["num_blocks"] == VLLM_NUM_BLOCKS
    (pool,) = plan["device_pools"]
    assert (pool["bytes_per_block"], pool["size"]) == (
        VLLM_BYTES_PER_BLOCK, VLLM_NUM_BLOCKS * VLLM_BYTES_PER_BLOCK)
    assert round(plan["capacity"]["max_concurrency"], 6) == VLLM_MAX_CONCURRENCY
    hp.check_plan(hp.KVCachePlan.model_validate_json(out))


def test_sized_on_gpus_from_its_parameter_count(cli: Run) -> None:
    code, out, err = cli("plan", "deepseek-v4-flash", "--gpu", "h200", "-tp", "8", "--json")
    assert code == 0, err
    memory = json.loads(out)["memory"]
    # 284e9 parameters x 4.34 bits / 8 bytes, split over the 8 ranks.
    assert memory["deployment"]["weights_bytes"] == 284_000_000_000 * 434 // 800
    weights = next(part for part in memory["per_rank"] if part["part"] == "weights")
    assert weights["bytes"] == memory["deployment"]["weights_bytes"] // 8
    assert memory["deployment"]["max_concurrency"] > 1
