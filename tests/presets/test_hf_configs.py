"""Public models' own config.json files (tests/hf_configs/NAME/config.json): each is planned
with the layer kinds vLLM 0.34's model code gives it, or refused naming the field; never planned
with a kind vLLM would not use. Read without transformers here (the fallback reader), and
through transformers' config classes in test_hf_transformers.py."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import hisparse_plan as hp
from hisparse_plan.models import MambaSpec
from hisparse_plan.presets import ConfigError, RegularArchitecture, Settings, build_request
from hisparse_plan.presets.config_file import load_config_file, model_from_config
from hisparse_plan.presets.hardware import find_gpu
from hisparse_plan.presets.model_weights import bits_per_parameter, index_weights
from support import paths
from support.cli_support import Run

CONFIGS = paths.HF_CONFIGS
NAMES = sorted(path.name for path in CONFIGS.iterdir())

Expected = dict[str, int] | str
"""Layer kinds and how many layers have each, or the field a refusal names."""

KINDS: dict[str, Expected] = {
    "ai21-jamba-mini-1.6": {"mamba": 28, "full": 4},
    "deepseek-r1": {"mla": 61},
    "deepseek-v2-lite": {"mla": 27},
    "deepseek-v3": {"mla": 61},
    "deepseek-v3.2-exp": "sparse",
    "falcon-h1-0.5b-instruct": {"full_and_mamba": 36},
    "falcon-h1-7b-instruct": {"full_and_mamba": 44},
    "gemma-2-27b-it": {"sliding": 23, "full": 23},
    "gemma-2-9b-it": {"sliding": 21, "full": 21},
    "gemma-3-1b-it": {"sliding": 22, "full": 4},
    "gemma-3-27b-it": {"sliding": 52, "full": 10},
    "gemma-3-4b-it": {"sliding": 29, "full": 5},
    "glm-5": "sparse",
    "gpt-oss-120b": {"sliding": 18, "full": 18},
    "gpt-oss-20b": {"sliding": 12, "full": 12},
    "kimi-k2-instruct": {"mla": 61},
    "llama-3.1-70b-instruct": {"full": 80},
    "llama-3.1-8b-instruct": {"full": 32},
    "llama-4-maverick-17b-128e-instruct": {"chunked": 36, "full": 12},
    "llama-4-scout-17b-16e-instruct": {"chunked": 36, "full": 12},
    # vLLM 0.34 retired MiniMaxM1ForCausalLM (v0.23.0 was the last to serve it).
    "minimax-m1-40k": "architectures",
    "mistral-7b-instruct-v0.3": {"full": 32},
    "mistral-7b-v0.1": {"sliding": 32},
    "mixtral-8x7b-instruct-v0.1": {"full": 32},
    "nemotron-h-4b-base-8k": {"mamba": 24, "none": 24, "full": 4},
    "phi-3-mini-4k-instruct": {"sliding": 32},
    "phi-3.5-mini-instruct": {"sliding": 32},
    "qwen2.5-7b-instruct": {"full": 28},
    "qwen2.5-7b-sliding-all": {"sliding": 28},
    "qwen2.5-7b-sliding-upper": "max_window_layers",
    "qwen2.5-vl-7b-instruct": {"full": 28},
    "qwen3-235b-a22b": {"full": 94},
    "qwen3-30b-a3b": {"full": 48},
    "qwen3-next-80b-a3b-instruct": {"linear": 36, "full": 12},
    # Issue 27's families, each as vLLM 0.34's model class builds it (tests/presets/test_families.py
    # pins every layer).
    "command-a-03-2025": {"sliding": 48, "full": 16},
    "exaone-4.0-32b": {"sliding": 48, "full": 16},
    # Decoder layers' kinds: the last 15 read layers 18 and 19's caches (test_kv_sharing.py).
    "gemma-3n-e4b-it": {"sliding": 28, "full": 7},
    "glm-4.7-flash": {"mla": 47},
    "granite-4.0-h-small": {"mamba": 36, "full": 4},
    "kimi-linear-48b-a3b-instruct": {"linear": 20, "mla": 7},
    "lfm2-1.2b": {"conv": 10, "full": 6},
    "lfm2-8b-a1b": {"conv": 18, "full": 6},
    "minimax-m2": {"full": 62},
    "qwen3.5-35b-a3b": {"linear": 30, "full": 10},
    # Issue 40: Mamba layers alone, from transformers' own config classes at small sizes.
    "falcon-mamba-small": {"mamba": 4},
    "mamba-small": {"mamba": 4},
    "mamba2-small": {"mamba": 4},
    "zamba2-small": {"mamba": 5, "full_and_mamba": 3},
    # Read through transformers' backend: layer_types from use_sliding_window and NoPE layers;
    # max_window_layers is read by neither transformers' SmolLM3Config nor vLLM.
    "smollm3-small": {"full": 4},
    # MiniCPM3's MLA fields, but vLLM's minicpm3.py caches per-head K and V.
    "minicpm3-small": {"full": 4},
    # Issue 40's registry sweep, edited from transformers' own classes at small sizes (each
    # pinned to vLLM 0.34's build, test_families.py): Gemma-4's last 4 layers read layers 7
    # and 5 (full layers: 512-wide heads, 2 KV heads); ZAYA1's CCA state beside each
    # attention cache, sliding where layer_types says so; HRM-Text's 2 layers a stack run at
    # 4 and 2 recurrence steps, a cache each, with a KV head for each of its 16 query heads
    # (the file's num_key_value_heads 8 is not read).
    "gemma4-shared-small": {"sliding": 10, "full": 2},
    "zaya-sliding-small": {"sliding_and_mamba": 2, "full_and_mamba": 2},
    "hrm-text-small": {"full": 12},
    # An encoder-decoder model: each decoder layer a full-attention cache and a cross-attention
    # cache of the encoder's output (vLLM's CrossAttentionSpec; test_cross_attention.py).
    "whisper-small": {"full_and_cross": 2},
}
WITHOUT_TRANSFORMERS: dict[str, Expected] = {
    **KINDS,
    # Gemma-3 as the Hub ships it leaves heads, head size and context to transformers.
    "gemma-3-27b-it": "max_position_embeddings",
    "gemma-3-4b-it": "num_attention_heads",
}
SHORT_CONTEXT = {"whisper-small": 448}
"""Fixtures whose model reads fewer than 4096 tokens (Whisper's decoder: max_target_positions)."""
REFUSED = {name for name, kinds in KINDS.items() if isinstance(kinds, str) and kinds != "sparse"}


def config(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((CONFIGS / name / "config.json").read_text())
    return loaded


def named_field(error: ConfigError) -> str:
    """The field a refusal names, which its message names too."""
    assert error.field is not None, str(error)
    assert f"{error.field}:" in str(error)
    return error.field


def kinds_or_refusal(name: str, *, use_transformers: bool) -> Expected:
    try:
        arch = load_config_file(CONFIGS / name / "config.json", use_transformers=use_transformers)
    except ConfigError as error:
        return named_field(error)
    if not isinstance(arch, RegularArchitecture):
        return "sparse"
    return dict(Counter(arch.layer_kinds()))


def test_every_fixture_has_an_expectation() -> None:
    assert len(NAMES) >= 25
    assert sorted(KINDS) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_kinds_without_transformers(name: str) -> None:
    assert kinds_or_refusal(name, use_transformers=False) == WITHOUT_TRANSFORMERS[name]


def test_patterns_follow_vllm_model_code() -> None:
    def kinds(name: str) -> list[str]:
        arch = model_from_config(config(name), origin=name, use_transformers=False)
        assert isinstance(arch, RegularArchitecture)
        return list(arch.layer_kinds())

    # Jamba: attention where i % 8 == 4.
    assert [i for i, k in enumerate(kinds("ai21-jamba-mini-1.6")) if k == "full"] == [4, 12, 20,
                                                                                       28]
    # Gemma-2 alternates from a sliding layer 0; gpt-oss too.
    assert kinds("gemma-2-9b-it")[:4] == ["sliding", "full", "sliding", "full"]
    assert kinds("gpt-oss-20b")[:2] == ["sliding", "full"]
    # Gemma-3: every 6th full; Llama-4: every 4th (NoPE) full; Qwen3-Next: every 4th full.
    assert [i for i, k in enumerate(kinds("gemma-3-1b-it")) if k == "full"] == [5, 11, 17, 23]
    assert kinds("llama-4-scout-17b-16e-instruct")[:4] == ["chunked"] * 3 + ["full"]
    assert kinds("qwen3-next-80b-a3b-instruct")[:4] == ["linear"] * 3 + ["full"]
    # Nemotron-H: the pattern's characters, one layer each.
    pattern = config("nemotron-h-4b-base-8k")["hybrid_override_pattern"]
    assert kinds("nemotron-h-4b-base-8k") == [
        {"M": "mamba", "*": "full", "-": "none"}[c] for c in pattern
    ]


@pytest.mark.parametrize(
    ("base", "field", "value"),
    [
        ("llama-3.1-8b-instruct", "attn_layer_period", 8),
        ("llama-3.1-8b-instruct", "hybrid_override_pattern", "M*" * 16),
        ("mistral-7b-v0.1", "attention_chunk_size", 8192),
        ("qwen2.5-7b-instruct", "full_attention_interval", 4),
        ("gemma-2-9b-it", "attn_type_list", [0, 1] * 21),
        ("deepseek-v3", "layer_types", ["full_attention"] * 61),
        ("llama-3.1-8b-instruct", "kv_lora_rank", 512),
    ],
)
def test_a_kind_deciding_field_the_model_does_not_read_is_refused(
    base: str, field: str, value: Any
) -> None:
    fields = {**config(base), field: value}
    with pytest.raises(ConfigError, match=field) as caught:
        model_from_config(fields, origin=base, use_transformers=False)
    assert caught.value.field == field


def test_layer_types_that_vllm_would_override_are_refused() -> None:
    fields = config("gpt-oss-20b")
    fields["layer_types"] = ["full_attention"] * 24
    with pytest.raises(ConfigError, match="layer_types: vLLM's gpt-oss code"):
        model_from_config(fields, origin="gpt-oss", use_transformers=False)
    fields = config("gemma-2-9b-it")
    fields["layer_types"] = ["global"] * 42
    with pytest.raises(ConfigError, match="got global"):
        model_from_config(fields, origin="gemma-2", use_transformers=False)


def test_layers_are_named_as_vllm_names_them() -> None:
    assert "language_model.model.layers.0.self_attn.attn" in _layers("gemma-3-1b-it", wrap=True)
    assert "model.layers.7.mixer.attn" in _layers("nemotron-h-4b-base-8k")
    assert "model.layers.1.attn.attn" in _layers("gpt-oss-20b")
    assert "model.layers.0.linear_attn" in _layers("qwen3-next-80b-a3b-instruct")


def test_every_missing_field_is_named() -> None:
    fields = {"model_type": "llama", "num_hidden_layers": 4, "num_attention_heads": 8}
    with pytest.raises(ConfigError, match=r"hidden_size: missing.*and 1 more: "
                                          r"max_position_embeddings"):
        model_from_config(fields, origin="x", use_transformers=False)


def test_missing_kv_heads_default_to_one_per_query_head() -> None:
    fields = config("llama-3.1-8b-instruct")
    del fields["num_key_value_heads"]
    arch = model_from_config(fields, origin="llama", use_transformers=False)
    assert isinstance(arch, RegularArchitecture)
    assert arch.num_key_value_heads == 32


def _layers(
    name: str, tp: int = 1, *, wrap: bool = False, **given: Any
) -> dict[str, hp.models.LayerSpec]:
    fields = config(name)
    if wrap:  # as a multimodal model's text_config
        fields = {"model_type": "wrapper", "vision_config": {}, "text_config": fields}
    arch = model_from_config(fields, origin=name, use_transformers=False)
    return dict(build_request(arch, Settings(tp=tp, max_model_len=8192, **given)).layers)


def test_plain_mla_keeps_one_576_element_latent_row_on_every_rank() -> None:
    for tp in (1, 8):
        layers = _layers("deepseek-v3", tp=tp)
        assert len(layers) == 61
        spec = layers["model.layers.0.self_attn.attn"]
        assert spec.kind == "mla"
        assert spec.page_size_bytes == 64 * 576 * 2
    with pytest.raises(ConfigError, match="plain MLA"):
        _layers("kimi-k2-instruct", kv_dtype="fp8_ds_mla")


def test_mamba_states_are_vllms() -> None:
    jamba = _layers("ai21-jamba-mini-1.6", tp=2)["model.layers.0.mixer"]
    assert isinstance(jamba, MambaSpec)
    assert jamba.state_shapes == [[3, 4096], [4096, 16]]
    nemotron = _layers("nemotron-h-4b-base-8k", tp=8)["model.layers.0.mixer"]
    assert isinstance(nemotron, MambaSpec)
    # 112 heads x 64 = 7168 wide, plus 2 x 8 groups x 128 state: 9216 conv channels over 8.
    assert nemotron.state_shapes == [[3, 1152], [14, 64, 128]]
    assert nemotron.state_dtypes == ["bfloat16", "float32"]
    falcon = _layers("falcon-h1-0.5b-instruct", tp=2)
    # vLLM's own names: layer i's mixer is model.{36 + i}.mixer.
    falcon_mamba = falcon["model.36.mixer"]
    assert isinstance(falcon_mamba, MambaSpec)
    # One group over 2 ranks: replicated to 2 groups.
    assert falcon_mamba.state_shapes == [[3, (1536 + 2 * 2 * 128) // 2], [12, 64, 128]]
    assert falcon["model.layers.0.attn"].kind == "full_attention"
    with pytest.raises(ConfigError, match="multiple of the tensor-parallel ranks"):
        _layers("nemotron-h-4b-base-8k", tp=32)


def test_hybrid_attention_blocks_align_to_the_mamba_page() -> None:
    layers = _layers("ai21-jamba-mini-1.6")
    attention = layers["model.layers.4.attn"]
    mamba = layers["model.layers.0.mixer"]
    assert attention.page_size_bytes == mamba.page_size_bytes
    assert attention.block_size % 16 == 0


def _with_index(tmp_path: Path, name: str) -> Path:
    """The fixture in a folder of its own, with its safetensors index (a stand-in total where
    the fixture has none)."""
    folder = tmp_path / name
    shutil.copytree(CONFIGS / name, folder)
    index = folder / "model.safetensors.index.json"
    if not index.exists():
        index.write_text(json.dumps({"metadata": {"total_size": 16 * 2**30}}))
    return folder / "config.json"


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
@pytest.mark.parametrize("name", sorted(set(NAMES) - REFUSED))
def test_every_model_plans_on_eight_h200s(
    cli: Run, tmp_path: Path, name: str, kv_cache_dtype: str,
) -> None:
    path = _with_index(tmp_path, name)
    length = str(SHORT_CONTEXT.get(name, 4096))
    code, out, err = cli("plan", "--hf-config", str(path), "--gpu", "h200", "-tp", "8",
                         "--kv-cache-dtype", kv_cache_dtype, "--max-model-len", length, "--json")
    assert code == 0, err
    body = json.loads(out)
    plan = hp.KVCachePlan.model_validate(body["plan"])
    rows = body["memory"]["per_rank"]
    assert sum(row["bytes"] for row in rows) == find_gpu("h200").hbm_bytes
    weights = index_weights(path)
    assert weights is not None
    assert body["memory"]["deployment"]["weights_bytes"] == weights.total_bytes
    deployment = body["memory"]["deployment"]
    assert deployment["gpus"] == 8
    assert deployment["kv_cache_bytes"] == 8 * plan.device_pools[0].size
    assert deployment["max_concurrency"] == plan.capacity.max_concurrency


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused_models_name_the_field_on_the_command_line(cli: Run, name: str) -> None:
    code, _, err = cli("plan", "--hf-config", str(CONFIGS / name / "config.json"))
    assert code != 0
    assert f"{KINDS[name]}:" in err


def test_weights_come_from_the_index_the_flag_or_parameters(cli: Run, tmp_path: Path) -> None:
    path = CONFIGS / "deepseek-v3" / "config.json"
    assert index_weights(path) is not None
    code, out, err = cli("plan", "--hf-config", str(path), "--gpu", "h200", "--tp", "8", "--plain")
    assert code == 0, err
    assert "deployment: 8 x NVIDIA H200" in out
    lonely = tmp_path / "config.json"
    shutil.copy(CONFIGS / "gpt-oss-120b" / "config.json", lonely)
    code, _, err = cli("plan", "--hf-config", str(lonely), "--gpu", "h200")
    assert code != 0
    assert "--weights-bytes" in err
    code, out, err = cli("plan", "--hf-config", str(lonely), "--gpu", "h200", "--parameters",
                         "116800000000", "--json")
    assert code == 0, err
    # mxfp4: 4.25 bits a parameter.
    assert json.loads(out)["memory"]["deployment"]["weights_bytes"] == 116800000000 * 17 // 32
    code, out, err = cli("plan", "--hf-config", str(lonely), "--gpu", "h200",
                         "--weights-bytes", "65GiB", "--json")
    assert code == 0, err
    assert json.loads(out)["memory"]["deployment"]["weights_bytes"] == 65 * 2**30
    code, _, err = cli("plan", "llama-3-8b", "--weights-bytes", "16GiB")
    assert code != 0
    assert "needs --gpu" in err


def test_bits_per_parameter() -> None:
    assert bits_per_parameter(config("deepseek-v3")) == "8"
    assert bits_per_parameter(config("gpt-oss-20b")) == "4.25"
    assert bits_per_parameter(config("llama-3.1-8b-instruct")) == "16"
    assert bits_per_parameter({"quantization_config": {"quant_method": "awq", "bits": 4}}) == "4"
    with pytest.raises(ConfigError, match="quant_method 'mystery'"):
        bits_per_parameter({"quantization_config": {"quant_method": "mystery"}})


def test_a_bad_index_is_refused(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors.index.json").write_text('{"metadata": {"total_size": "big"}}')
    with pytest.raises(ConfigError, match=r"metadata.total_size: expected"):
        index_weights(tmp_path / "config.json")


def test_plain_mla_takes_an_fp8_cache(cli: Run) -> None:
    """vLLM's --kv-cache-dtype fp8 on DeepSeek-V3 stores the 576-element latent row as 576
    bytes: half the bfloat16 page."""
    config = str(CONFIGS / "deepseek-v3" / "config.json")
    pages = []
    for dtype in ("auto", "fp8"):
        code, out, err = cli("plan", "--hf-config", config, "--kv-cache-dtype", dtype,
                             "--gpu-mem", "60GiB", "--json")
        assert code == 0, err
        pages.append(json.loads(out)["groups"][0]["spec"]["page_size_bytes"])
    assert pages == [64 * 576 * 2, 64 * 576]


@pytest.mark.parametrize(("weights", "cache"), [
    ("float16", "float16"), ("bfloat16", "bfloat16"), ("float32", "bfloat16"), (None, "bfloat16"),
])
def test_auto_caches_take_the_models_dtype(weights: str | None, cache: str) -> None:
    """`auto` is the model's own dtype, as vLLM and SGLang resolve it: a float16 checkpoint
    keeps float16 caches (same bytes as bfloat16, another element type); float32 runs in
    bfloat16."""
    config = json.loads((CONFIGS / "llama-3.1-8b-instruct" / "config.json").read_text())
    config.pop("torch_dtype", None)
    if weights is not None:
        config["torch_dtype"] = weights
    arch = model_from_config(config, origin="config.json", use_transformers=False)
    request = build_request(arch, Settings(max_model_len=4096))
    assert {getattr(spec, "dtype", None) for spec in request.layers.values()} == {cache}
    fp8 = build_request(arch, Settings(max_model_len=4096, kv_dtype="fp8_e4m3"))
    assert {getattr(spec, "dtype", None) for spec in fp8.layers.values()} == {"uint8"}
