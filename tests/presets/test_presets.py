"""Model presets: config.json fields in, the golden requests and plans out."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import hisparse_plan as hp
from hisparse_plan.models import KVCacheLayout, MLASpec
from hisparse_plan.presets import (
    INDEXER_LAYER,
    SPARSE_LAYER,
    ConfigError,
    ModelArchitecture,
    Settings,
    architecture_from_config,
    build_request,
    host_pool_gib,
    load_config_file,
    load_preset,
    override_request,
    preset_names,
    row_geometry,
)
from support.golden import load, project

GIB = 2**30

# The config.json numbers the issue names, independent of the shipped data file.
DEEPSEEK_V32 = {
    "num_hidden_layers": 61, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
    "index_head_dim": 128, "index_topk": 2048, "max_position_embeddings": 163840,
}
GLM_5 = {**DEEPSEEK_V32, "num_hidden_layers": 78, "max_position_embeddings": 202752}

GOLDEN_PRESETS: dict[str, tuple[str, Settings]] = {
    "deepseek_v32_fp8": ("deepseek-v3.2", Settings()),
    "glm5_fp8_blhnc": (
        "glm-5",
        Settings(gpu_mem_bytes=90 * GIB, host_pool_bytes=256 * GIB, device_buffer_size=6144,
                 layout=KVCacheLayout.BLHNC, max_num_batched_tokens=16384),
    ),
    "index_share_every_4": (
        "glm-5-index-share-4",
        Settings(max_model_len=131072, host_pool_bytes=128 * GIB, gpu_mem_bytes=40 * GIB),
    ),
    "deepseek_v32_fp8_mtp3_shared_pool": (
        "deepseek-v3.2",
        Settings(tp=8, spec_tokens=3, gpu_mem_bytes=100 * GIB, host_pool_bytes=512 * GIB),
    ),
}


def _sparse_and_indexer(request: hp.PlanRequest) -> tuple[list[MLASpec], list[MLASpec]]:
    specs = [s for s in request.layers.values() if isinstance(s, MLASpec)]
    return (
        [s for s in specs if s.cache_role == "sparse"],
        [s for s in specs if s.cache_role == "indexer"],
    )


@pytest.mark.parametrize(("name", "fields"), [
    ("deepseek-v3.2", DEEPSEEK_V32), ("glm-5", GLM_5), ("glm-5.1", GLM_5),
])
def test_shipped_fields_are_the_models_config_numbers(name: str, fields: dict[str, int]) -> None:
    arch = load_preset(name).sparse_architecture
    assert arch is not None
    assert arch.model_dump(include=set(fields)) == fields
    assert all(arch.leaders())


@pytest.mark.parametrize(("name", "layers"), [
    ("deepseek-v3.2", 61), ("glm-5", 78), ("glm-5.1", 78), ("glm-5-index-share-4", 78),
])
def test_fp8_pages_and_layer_counts(name: str, layers: int) -> None:
    request = build_request(load_preset(name).architecture)
    sparse, indexer = _sparse_and_indexer(request)
    assert len(sparse) == layers
    # fp8_ds_mla: 512 fp8 + 4 float32 scales + 64 bf16 rope = 656 bytes a token, 64 a block.
    assert {s.page_size_bytes for s in sparse} == {64 * 656} == {41984}
    # The indexer: 128 fp8 + one float32 scale = 132 bytes a token.
    assert {s.page_size_bytes for s in indexer} == {64 * 132} == {8448}
    expected_indexers = 20 if name == "glm-5-index-share-4" else layers
    assert len(indexer) == expected_indexers


def test_bfloat16_pages() -> None:
    request = build_request(load_preset("deepseek-v3.2").architecture,
                            Settings(kv_dtype="bfloat16"))
    sparse, indexer = _sparse_and_indexer(request)
    assert {s.page_size_bytes for s in sparse} == {64 * 576 * 2}
    # The indexer cache stays fp8 (128 bytes + one float32 scale) whatever the latent dtype.
    assert {s.page_size_bytes for s in indexer} == {64 * 132}
    assert {s.dtype for s in sparse} == {"bfloat16"}
    assert {(s.dtype, s.head_size) for s in indexer} == {("uint8", 132)}
    assert all(s.state_content_bytes is None for s in sparse)


@pytest.mark.parametrize("kv_dtype", ["fp8_ds_mla", "bfloat16"])
def test_indexer_dim_needs_whole_scale_tiles(kv_dtype: Any) -> None:
    arch = architecture_from_config({**DEEPSEEK_V32, "index_head_dim": 100}, origin="test")
    with pytest.raises(hp.PlanError, match=r"index_head_dim: .*multiple of 128, got 100"):
        row_geometry(arch, kv_dtype)


def test_context_past_max_position_embeddings_needs_the_allow_flag() -> None:
    arch = load_preset("deepseek-v3.2").architecture
    with pytest.raises(ConfigError, match=r"model.max_model_len: expected at most .*163840\), "
                       r"got 163841") as refused:
        build_request(arch, Settings(max_model_len=163841))
    assert refused.value.field == "model.max_model_len"
    allowed = build_request(arch, Settings(max_model_len=163841, allow_long_context=True))
    assert allowed.model.max_model_len == 163841
    assert build_request(arch, Settings(max_model_len=163840)).model.max_model_len == 163840


def test_block_size_is_a_setting() -> None:
    request = build_request(load_preset("glm-5").architecture, Settings(block_size=16))
    sparse, indexer = _sparse_and_indexer(request)
    assert {s.page_size_bytes for s in sparse} == {16 * 656}
    assert {s.page_size_bytes for s in indexer} == {16 * 132}


@pytest.mark.parametrize("case", sorted(GOLDEN_PRESETS))
def test_preset_request_and_plan_are_the_golden_ones(case: str) -> None:
    golden_request, expected = load(case)
    name, settings = GOLDEN_PRESETS[case]
    request = build_request(load_preset(name).architecture, settings)
    golden = hp.PlanRequest.model_validate(golden_request)
    assert request == golden
    assert list(request.layers) == list(golden.layers)  # dict equality ignores order
    assert project(hp.plan(request).model_dump(mode="json")) == expected


def test_default_preset_is_the_worked_example() -> None:
    request = build_request(load_preset("deepseek-v3.2").architecture)
    assert request.device.available_bytes == 64424509440
    assert request.hisparse is not None
    assert int(request.hisparse.host_pool_gib * GIB) == 64 * GIB
    assert request.model.max_model_len == 163840
    assert request.device.kv_cache_layout is KVCacheLayout.BLNHC


def test_layer_names_and_order() -> None:
    request = build_request(load_preset("glm-5-index-share-4").architecture)
    names = list(request.layers)
    assert names[:3] == [SPARSE_LAYER.format(0), INDEXER_LAYER.format(0), SPARSE_LAYER.format(1)]
    assert names[-1] == SPARSE_LAYER.format(77)
    indexers = [n for n in names if n.endswith(".indexer.k_cache")]
    assert indexers == [INDEXER_LAYER.format(i) for i in range(0, 78, 4)]


@pytest.mark.parametrize("name", ["DeepSeek-V3.2", "deepseek_v3.2", " deepseek-v32 ", "GLM5"])
def test_names_and_aliases(name: str) -> None:
    assert load_preset(name).name in preset_names()


def test_unknown_model_lists_the_presets() -> None:
    with pytest.raises(ConfigError, match="unknown model 'llama'") as refused:
        load_preset("llama")
    assert all(name in str(refused.value) for name in preset_names())


# -- which layers run an indexer --------------------------------------------------------------


def _arch(**extra: Any) -> ModelArchitecture:
    return architecture_from_config({**DEEPSEEK_V32, "num_hidden_layers": 8, **extra},
                                    origin="test")


def test_index_topk_freq_is_read_as_vllm_reads_it() -> None:
    # Offset 1: layers 0, 4; vLLM's default offset 2: layers 0, 1, 5.
    assert _arch(index_topk_freq=4, index_skip_topk_offset=1).leaders() == [
        True, False, False, False, True, False, False, False]
    assert _arch(index_topk_freq=4).leaders() == [
        True, True, False, False, False, True, False, False]


def test_pattern_and_indexer_types() -> None:
    assert _arch(index_topk_pattern="FSSFSSFS").leaders() == [
        True, False, False, True, False, False, True, False]
    types = ["full", "shared", "full", "shared", "full", "shared", "full", "shared"]
    # indexer_types wins over the other fields, as in newer configs that carry both.
    arch = _arch(indexer_types=types, index_topk_freq=4)
    assert arch.leaders() == [t == "full" for t in types]
    assert arch.sharing_source == "indexer_types"


@pytest.mark.parametrize(("extra", "why"), [
    ({"index_topk_pattern": "SFFFFFFF"}, "layer 0 must run its own indexer"),
    ({"index_topk_pattern": "FFS"}, "one 'F'"),
    ({"index_topk_pattern": "FFXFFFFF"}, "one 'F'"),
    ({"indexer_types": ["full"]}, "an entry for each of the 8 layers"),
    ({"index_topk_freq": 0}, "greater than or equal to 1"),
    ({"index_topk_freq": 2, "index_skip_topk_offset": 0}, "layer 0 must run its own"),
])
def test_bad_sharing_fields_are_refused(extra: dict[str, Any], why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        _arch(**extra)


@given(freq=st.integers(1, 8), offset=st.integers(1, 8), layers=st.integers(1, 100))
def test_freq_sharing_invariants(freq: int, offset: int, layers: int) -> None:
    arch = architecture_from_config(
        {**DEEPSEEK_V32, "num_hidden_layers": layers, "index_topk_freq": freq,
         "index_skip_topk_offset": offset},
        origin="test",
    )
    leaders = arch.leaders()
    assert len(leaders) == layers
    assert leaders[0]
    # Before the offset every layer runs an indexer; from it on, one in every `freq`.
    assert all(leaders[: offset - 1])
    tail = leaders[offset - 1:]
    for start in range(len(tail) - freq + 1):
        assert sum(tail[start:start + freq]) == 1
    request = build_request(arch, Settings(max_model_len=4096, host_pool_bytes=GIB))
    _, indexer = _sparse_and_indexer(request)
    assert len(indexer) == sum(leaders)


# -- a user's config.json ------------------------------------------------------------------------


def _write(path: Path, config: object) -> Path:
    path.write_text(json.dumps(config))
    return path


def test_config_file_with_every_other_field(tmp_path: Path) -> None:
    config = {
        "architectures": ["DeepseekV32ForCausalLM"], "model_type": "deepseek_v32",
        "hidden_size": 7168, "num_attention_heads": 128, "index_n_heads": 64,
        "rope_scaling": {"factor": 40, "type": "yarn"}, "num_nextn_predict_layers": 1,
        **DEEPSEEK_V32,
    }
    arch = load_config_file(_write(tmp_path / "config.json", config))
    assert arch == load_preset("deepseek-v3.2").architecture


def test_config_file_under_text_config(tmp_path: Path) -> None:
    arch = load_config_file(_write(tmp_path / "c.json", {"text_config": GLM_5}))
    assert arch.num_hidden_layers == 78


@pytest.mark.parametrize(("config", "why"), [
    ({k: v for k, v in DEEPSEEK_V32.items() if k != "index_topk"}, "index_topk: missing"),
    ({**DEEPSEEK_V32, "num_hidden_layers": "61"}, "num_hidden_layers: Input should be"),
    ([1, 2], "expected a JSON object"),
])
def test_bad_config_files_name_the_file_and_field(
    tmp_path: Path, config: object, why: str
) -> None:
    path = _write(tmp_path / "config.json", config)
    with pytest.raises(ConfigError, match=why) as refused:
        load_config_file(path)
    assert str(path) in str(refused.value)


def test_config_file_that_is_not_json(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="Invalid JSON"):
        load_config_file(path)


def test_fp8_needs_whole_scale_tiles() -> None:
    arch = architecture_from_config({**DEEPSEEK_V32, "kv_lora_rank": 500}, origin="test")
    with pytest.raises(hp.PlanError, match="kv_lora_rank: the fp8 cache scales every 128"):
        row_geometry(arch, "fp8_ds_mla")
    assert row_geometry(arch, "bfloat16").sparse_row_bytes == (500 + 64) * 2


# -- settings on a request --------------------------------------------------------------------


@given(st.integers(1, 2**53 - 1))
def test_host_pool_bytes_survive_the_gib_float(nbytes: int) -> None:
    assert int(host_pool_gib(nbytes) * GIB) == nbytes


@pytest.mark.parametrize("nbytes", [0, -1, 2**53])
def test_host_pool_bytes_out_of_range(nbytes: int) -> None:
    with pytest.raises(ConfigError, match="host pool"):
        host_pool_gib(nbytes)


def test_tp_shares_the_host_pool() -> None:
    arch = load_preset("deepseek-v3.2").architecture
    shared = build_request(arch, Settings(tp=8))
    assert shared.hisparse is not None
    assert shared.hisparse.shared_host_pool
    alone = override_request(shared, Settings(tp=1))
    assert alone.hisparse is not None
    assert not alone.hisparse.shared_host_pool


def test_override_replaces_only_what_was_given() -> None:
    golden, _ = load("glm5_fp8_blhnc")
    request = hp.PlanRequest.model_validate(golden)
    assert override_request(request, Settings()) is request
    changed = override_request(request, Settings(gpu_mem_bytes=GIB, spec_tokens=2))
    assert changed.device.available_bytes == GIB
    assert changed.hisparse is not None
    assert changed.hisparse.max_decode_query_len == 3
    assert changed.hisparse.device_buffer_size == 6144
    assert changed.scheduler == request.scheduler
    assert changed.layers == request.layers


@pytest.mark.parametrize("settings", [Settings(kv_dtype="bfloat16"), Settings(block_size=16)])
def test_override_refuses_layer_shaping_settings(settings: Settings) -> None:
    golden, _ = load("deepseek_v32_fp8")
    with pytest.raises(ConfigError, match="shapes the layers"):
        override_request(hp.PlanRequest.model_validate(golden), settings)


@pytest.mark.parametrize(("kwargs", "field", "message"), [
    ({"gpu_mem_bytes": -1}, "gpu_mem_bytes", "Settings.gpu_mem_bytes: expected an integer >= 0, "
                                             "got -1"),
    ({"host_pool_bytes": 0}, "host_pool_bytes", "Settings.host_pool_bytes: expected an integer "
                                                ">= 1, got 0"),
    ({"tp": 0}, "tp", "Settings.tp: expected an integer >= 1, got 0"),
    ({"max_model_len": "8k"}, "max_model_len", "Settings.max_model_len: expected an integer, "
                                               "got '8k'"),
    ({"block_size": True}, "block_size", "Settings.block_size: expected an integer, got True"),
    ({"stage_gpu_mem_bytes": (GIB, -2)}, "stage_gpu_mem_bytes",
     r"Settings.stage_gpu_mem_bytes\[1\]: expected an integer >= 0, got -2"),
])
def test_settings_errors_name_their_own_fields(
    kwargs: dict[str, object], field: str, message: str
) -> None:
    """Issue 28: Settings(gpu_mem_bytes=-1) named the request's device.available_bytes (and
    host_pool_bytes the request's hisparse.host_pool_gib), fields the caller never wrote."""
    with pytest.raises(ConfigError, match=message) as refused:
        Settings(**kwargs)  # type: ignore[arg-type]
    assert refused.value.field == field
    assert "device.available_bytes" not in str(refused.value)
