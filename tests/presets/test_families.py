"""The config reader's families (presets/families) against what vLLM 0.34's own model classes
build. tests/hf_configs/NAME/vllm-layers.json holds each fixture's cache layers as
references/vllm_family_sweep.py --pin recorded them from vLLM's meta build (name, kind, KV heads,
head sizes, dtype, window or chunk, MLA row, state shapes and dtypes; tensor parallel size 1):
checked here without vLLM, through transformers and without it. Then each family's rules that
the fixtures do not show: refusals, vLLM's defaults, and state and page sizes, each worked out
by hand from the configs."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import pytest
from test_hf_configs import WITHOUT_TRANSFORMERS, config

import hisparse_plan as hp
from hisparse_plan.adapters.vllm.meta_model import MODEL_FACTS
from hisparse_plan.models import MambaSpec, MLASpec, PlanRequest
from hisparse_plan.presets import ConfigError, RegularArchitecture, Settings, build_request
from hisparse_plan.presets.config_file import load_config_file, model_from_config
from hisparse_plan.presets.families import FAMILIES, family_of
from hisparse_plan.presets.hf_transformers import transformers_available
from support import paths

CONFIGS = paths.HF_CONFIGS
PIN = "vllm-layers.json"
PINNED = sorted(path.parent.name for path in CONFIGS.glob(f"*/{PIN}"))
NOT_BUILT_HERE = {
    "sparse_mla": "DSA layers are built on a GPU only (vLLM's sparse MLA backends)",
    "deepseek_v4": "no fixture: references/vllm_v4_flash.py checks the preset on vLLM",
    "minimax": "vLLM 0.34 serves no MiniMax lightning hybrid",
    "unplanned": "refused by name, nothing to compare",
    "falcon": "pinned by the registry sweep's FalconConfig (tests/vllm_registry.json)",
    "cohere2_moe": "pinned by the registry sweep's Cohere2MoeConfig (tests/vllm_registry.json)",
    "whisper": "pinned by the registry sweep's WhisperConfig (tests/vllm_registry.json), and "
               "its plan by tests/targets/vllm/test_cross_attention.py",
    "exaone_moe": "pinned by the registry sweep's ExaoneMoeConfig (tests/vllm_registry.json)",
    "olmo_hybrid": "pinned by the registry sweep's OlmoHybridConfig (tests/vllm_registry.json)",
    "afmoe": "pinned by the registry sweep's AfmoeConfig (tests/vllm_registry.json)",
    "inkling": "pinned by the registry sweep's InklingMMConfig (tests/vllm_registry.json), its "
               "local layers and plan by tests/presets/test_registry_families.py",
}
"""Families no fixture is pinned for, and why."""


def text_model_type(name: str) -> str | None:
    fields = config(name)
    inner = fields.get("text_config")
    if "num_hidden_layers" not in fields and isinstance(inner, dict):
        fields = inner
    model_type = fields.get("model_type")
    return None if model_type is None else str(model_type)


def pinned(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((CONFIGS / name / PIN).read_text())
    return loaded


def vllm_layers(pin: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The pin's layers in order, each with its spec's facts."""
    return {layer: pin["specs"][key] for layer, key in pin["layers"]}


def reader_request(name: str, *, use_transformers: bool) -> PlanRequest:
    arch = load_config_file(CONFIGS / name / "config.json", use_transformers=use_transformers)
    return build_request(arch, Settings(max_model_len=4096))


def reader_layers(name: str, *, use_transformers: bool) -> dict[str, dict[str, Any]]:
    """The reader's layers of one fixture at tensor parallel size 1 that keep a cache of their
    own (vLLM gives the others no spec), each with the facts vLLM's model code decides
    (`MODEL_FACTS`)."""
    request = reader_request(name, use_transformers=use_transformers)
    return {layer: {key: value for key, value
                    in spec.model_dump(mode="json", exclude_none=True).items()
                    if key in MODEL_FACTS}
            for layer, spec in request.layers.items()
            if getattr(spec, "kv_sharing_target", None) is None}


def reader_sharing(name: str, *, use_transformers: bool) -> dict[str, str]:
    """Layer -> the layer whose cache it reads, as the reader declares it."""
    request = reader_request(name, use_transformers=use_transformers)
    return {layer: target for layer, spec in request.layers.items()
            if (target := getattr(spec, "kv_sharing_target", None)) is not None}


def first_difference(ours: Mapping[str, Mapping[str, Any]],
                     theirs: Mapping[str, Mapping[str, Any]]) -> str | None:
    """Where two layer lists first differ (names in order, then each layer's facts), or None."""
    if list(ours) != list(theirs):
        return f"layer names: reader {list(ours)[:3]}..., vLLM {list(theirs)[:3]}..."
    for layer, facts in theirs.items():
        if dict(ours[layer]) != dict(facts):
            return f"{layer}: reader {dict(ours[layer])}, vLLM {dict(facts)}"
    return None


def test_every_family_is_pinned_or_says_why() -> None:
    pinned_families = {family_of(text_model_type(name)).name for name in PINNED}
    for family in FAMILIES:
        assert (family.name in pinned_families) != (family.name in NOT_BUILT_HERE), family.name
    assert len(PINNED) >= 39


@pytest.mark.parametrize("use_transformers", [False, True], ids=["fallback", "transformers"])
@pytest.mark.parametrize("name", PINNED)
def test_the_reader_builds_the_layers_vllm_builds(name: str, use_transformers: bool) -> None:
    if use_transformers and not transformers_available():
        pytest.skip("transformers is not installed")
    if not use_transformers and isinstance(WITHOUT_TRANSFORMERS[name], str):
        pytest.skip("refused without transformers' defaults (test_hf_configs)")
    pin = pinned(name)
    assert pin["vllm"].startswith("0.34"), pin["vllm"]
    assert first_difference(reader_layers(name, use_transformers=use_transformers),
                            vllm_layers(pin)) is None
    assert reader_sharing(name, use_transformers=use_transformers) == pin.get("shared", {})


def test_a_layer_that_differs_from_vllms_is_found() -> None:
    """The comparison above fails on a one-token window difference (Cohere's + 1) and on a
    missing layer."""
    theirs = vllm_layers(pinned("command-a-03-2025"))
    ours = reader_layers("command-a-03-2025", use_transformers=False)
    window = {layer: {**facts, "sliding_window": facts["sliding_window"] - 1}
              if "sliding_window" in facts else facts for layer, facts in ours.items()}
    assert "sliding_window" in str(first_difference(window, theirs))
    shorter = dict(list(ours.items())[:-1])
    assert "layer names" in str(first_difference(shorter, theirs))


def layers(name: str, tp: int = 1, **given: Any) -> PlanRequest:
    arch = model_from_config(config(name), origin=name, use_transformers=False)
    return build_request(arch, Settings(tp=tp, max_model_len=4096, **given))


# -- each family's own rules -------------------------------------------------------------------


def test_cohere_window_layers_keep_one_token_more() -> None:
    """Command-A: sliding_window 4096; vLLM's Cohere code keeps 4097 tokens, three layers of
    four, heads hidden_size / num_attention_heads = 12288 / 96 = 128 wide."""
    specs = layers("command-a-03-2025").layers
    windows = [getattr(spec, "sliding_window", None) for spec in specs.values()]
    assert windows == [4097, 4097, 4097, None] * 16
    assert {spec.head_size for spec in specs.values()} == {128}  # type: ignore[union-attr]


@pytest.mark.parametrize(("name", "pattern", "windows"), [
    ("exaone-4.0-32b", 2, [4096, None] * 32),
    ("exaone-4.0-32b", "LLLG", None),
    ("command-a-03-2025", "LLLG", None),
])
def test_an_integer_window_pattern_is_read_as_transformers_reads_it(
    name: str, pattern: Any, windows: list[int | None] | None,
) -> None:
    fields = {**config(name), "sliding_window_pattern": pattern}
    if windows is None:
        with pytest.raises(ConfigError, match=r"sliding_window_pattern: .* positive integer"):
            model_from_config(fields, origin=name, use_transformers=False)
        return
    arch = model_from_config(fields, origin=name, use_transformers=False)
    request = build_request(arch, Settings(max_model_len=8192))
    assert [getattr(s, "sliding_window", None) for s in request.layers.values()] == windows


@pytest.mark.parametrize("use_transformers", [False, True], ids=["fallback", "transformers"])
def test_exaone4_as_published_reads_layer_types_not_its_string_pattern(
    use_transformers: bool,
) -> None:
    """Issue 40: EXAONE-4.0-32B's config.json carries `"sliding_window_pattern": "LLLG"` beside
    `layer_types`; transformers (and so vLLM's exaone4.py) take the kinds from layer_types and
    never read the string. The reader gives the layers vLLM built for the fixture (its pin)."""
    if use_transformers and not transformers_available():
        pytest.skip("transformers is not installed")
    kinds = ["sliding_attention"] * 3 + ["full_attention"]
    fields = {**config("exaone-4.0-32b"), "sliding_window_pattern": "LLLG",
              "layer_types": kinds * 16}
    arch = model_from_config(fields, origin="exaone", use_transformers=use_transformers)
    request = build_request(arch, Settings(max_model_len=4096))
    ours = {layer: {key: value for key, value
                    in spec.model_dump(mode="json", exclude_none=True).items()
                    if key in MODEL_FACTS}
            for layer, spec in request.layers.items()}
    assert first_difference(ours, vllm_layers(pinned("exaone-4.0-32b"))) is None
    # Without layer_types, transformers cannot derive kinds from the string (its own
    # Exaone4Config raises, as it would under vLLM): refused.
    del fields["layer_types"]
    with pytest.raises(ConfigError, match=r"sliding_window_pattern|Exaone4Config refuses"):
        model_from_config(fields, origin="exaone", use_transformers=use_transformers)


def test_exaone4_without_a_window_is_all_full_and_without_the_field_is_refused() -> None:
    fields = {**config("exaone-4.0-32b"), "sliding_window": None}
    arch = model_from_config(fields, origin="exaone", use_transformers=False)
    assert isinstance(arch, RegularArchitecture)
    assert set(arch.layer_kinds()) == {"full"}
    del fields["sliding_window"]
    with pytest.raises(ConfigError, match="sliding_window: missing; transformers"):
        model_from_config(fields, origin="exaone", use_transformers=False)


def test_gemma3n_shares_the_last_layers_caches_as_vllm_names_them() -> None:
    """Layers 20 to 34 (num_kv_shared_layers 15 of 35) keep no cache: a sliding one reads layer
    20 - 2 = 18's, a full one layer 20 - 1 = 19's (vLLM's Gemma3nAttention); layer_types is
    four sliding, one full, so layers 24, 29, 34 are the full ones."""
    fields = config("gemma-3n-e4b-it")
    request = layers("gemma-3n-e4b-it")
    name = "language_model.model.layers.{}.self_attn.attn".format
    targets = {layer: getattr(spec, "kv_sharing_target", None)
               for layer, spec in request.layers.items()}
    full = {24, 29, 34}
    assert fields["text_config"]["num_kv_shared_layers"] == 15
    assert targets == {name(i): None if i < 20 else name(19 if i in full else 18)
                       for i in range(35)}
    with pytest.raises(ConfigError, match=r"num_kv_shared_layers: expected at most 33 of the "
                                          "35 layers"):
        model_from_config({**fields, "text_config": {**fields["text_config"],
                                                     "num_kv_shared_layers": 34}},
                          origin="gemma-3n", use_transformers=False)


def test_kv_sharing_outside_gemma3n_is_refused_and_zero_shares_nothing() -> None:
    unshared = {**config("gemma-3n-e4b-it"),
                "text_config": {**config("gemma-3n-e4b-it")["text_config"],
                                "num_kv_shared_layers": 0}}
    arch = model_from_config(unshared, origin="gemma-3n", use_transformers=False)
    assert isinstance(arch, RegularArchitecture)
    assert len(arch.layer_kinds()) == 35
    assert not arch.kv_sharing
    llama = config("llama-3.1-8b-instruct")
    model_from_config({**llama, "num_kv_shared_layers": 0}, origin="llama",
                      use_transformers=False)
    with pytest.raises(ConfigError, match="num_kv_shared_layers: it decides layer kinds"):
        model_from_config({**llama, "num_kv_shared_layers": 8}, origin="llama",
                          use_transformers=False)


def test_minimax_m2_is_full_attention_only_when_its_list_says_so() -> None:
    fields = config("minimax-m2")
    fields["attn_type_list"] = [1] * 61 + [0]
    with pytest.raises(ConfigError, match=r"attn_type_list: .* layer 61 is 0"):
        model_from_config(fields, origin="minimax-m2", use_transformers=False)
    with pytest.raises(ConfigError, match="attn_type_list: MiniMax lightning"):
        model_from_config({**config("llama-3.1-8b-instruct"), "attn_type_list": [1] * 32},
                          origin="llama", use_transformers=False)


def test_lfm2_layer_types_come_from_full_attn_idxs_or_are_refused() -> None:
    fields = config("lfm2-1.2b")
    kinds = [k for k in fields.pop("layer_types")]
    derived = model_from_config({**fields, "full_attn_idxs": [2, 5, 8, 10, 12, 14]},
                                origin="lfm2", use_transformers=False)
    assert isinstance(derived, RegularArchitecture)
    assert derived.layer_kinds() == ["full" if k == "full_attention" else "conv" for k in kinds]
    with pytest.raises(ConfigError, match="layer_types: missing, and no full_attn_idxs"):
        model_from_config(fields, origin="lfm2", use_transformers=False)
    with pytest.raises(ConfigError, match="full_attn_idxs: it decides layer kinds"):
        model_from_config({**config("llama-3.1-8b-instruct"), "full_attn_idxs": [1]},
                          origin="llama", use_transformers=False)


def test_kimi_linear_takes_vllms_config_defaults_and_refuses_contradictions() -> None:
    """vLLM reads Kimi-Linear with its own KimiLinearConfig: max_position_embeddings 4096 when
    the file has none (it has model_max_length only), through transformers or not."""
    for use_transformers in (False, True):
        arch = load_config_file(CONFIGS / "kimi-linear-48b-a3b-instruct" / "config.json",
                                use_transformers=use_transformers)
        assert arch.max_position_embeddings == 4096
    fields = config("kimi-linear-48b-a3b-instruct")
    linear = fields["linear_attn_config"]
    for bad, match in (
        ({**linear, "full_attn_layers": [1, *linear["full_attn_layers"]]}, "listed as KDA and"),
        ({**linear, "kda_layers": [0, *linear["kda_layers"]]}, "counted from 1"),
        ({**linear, "use_full_rank_gate": True}, "Kimi-K3 variant"),
    ):
        with pytest.raises(ConfigError, match=match):
            model_from_config({**fields, "linear_attn_config": bad}, origin="kimi",
                              use_transformers=False)


@pytest.mark.parametrize("model_type", ["qwen4_exp", "glm5_next"])
def test_layouts_no_family_reads_are_refused_by_name(model_type: str) -> None:
    fields = {**config("llama-3.1-8b-instruct"), "model_type": model_type}
    with pytest.raises(ConfigError, match=f"model_type: vLLM 0.34's code for '{model_type}' "
                                          "builds") as caught:
        model_from_config(fields, origin=model_type, use_transformers=False)
    assert caught.value.field == "model_type"


# -- state shapes, dtypes and pages, from the configs by hand ----------------------------------


def state(request: PlanRequest) -> MambaSpec:
    return next(s for s in request.layers.values() if isinstance(s, MambaSpec))


def test_state_layers_shapes_and_dtypes_per_rank() -> None:
    # LFM2: conv_dim 2048 over 2 ranks, conv_L_cache 3.
    lfm2 = state(layers("lfm2-1.2b", tp=2))
    assert (lfm2.state_shapes, lfm2.state_dtypes) == ([[2, 1024]], ["bfloat16"])
    # LFM2-MoE: its conv width is hidden_size (2048).
    assert state(layers("lfm2-8b-a1b", tp=4)).state_shapes == [[2, 512]]
    # Kimi-Linear KDA: 32 heads of 128 over 4 ranks: q, k, v of 8 x 128 each; float32 state.
    kda = state(layers("kimi-linear-48b-a3b-instruct", tp=4))
    assert kda.state_shapes == [[3, 3 * 8 * 128], [8, 128, 128]]
    assert kda.state_dtypes == ["bfloat16", "float32"]
    # Qwen3.5: 16 key and 32 value heads of 128, kernel 4; mamba_ssm_dtype float32.
    qwen = state(layers("qwen3.5-35b-a3b", tp=2))
    assert qwen.state_shapes == [[3, (2 * 16 * 128 + 32 * 128) // 2], [16, 128, 128]]
    assert qwen.state_dtypes == ["bfloat16", "float32"]
    # Granite-4.0-H: 4096 x 2 wide, 128 heads of 64, one group replicated to 8, state 128.
    granite = state(layers("granite-4.0-h-small", tp=8))
    assert granite.state_shapes == [[3, (8192 + 2 * 8 * 128) // 8], [16, 64, 128]]
    assert granite.state_dtypes == ["bfloat16", "bfloat16"]
    with pytest.raises(ConfigError, match="tp: the KDA heads"):
        layers("kimi-linear-48b-a3b-instruct", tp=64)
    odd = model_from_config({**config("lfm2-1.2b"), "conv_dim": 2049}, origin="lfm2",
                            use_transformers=False)
    with pytest.raises(ConfigError, match=r"tp: the short-convolution conv dimension \(2049"):
        build_request(odd, Settings(tp=2, max_model_len=4096))


def test_mla_beside_kda_takes_vllms_hybrid_block() -> None:
    """Kimi-Linear, bfloat16: a KDA state is 3 x 12288 x 2 + 32 x 128 x 128 x 4 = 2,170,880
    bytes; one latent row (576 x 2 = 1,152 bytes) a token on 128-token blocks: 128 x
    ceil(2,170,880 / (128 x 1,152)) = 1,920 tokens, and the state page padded to 1,920 x 1,152.
    The plan holds both in pages of one size."""
    request = layers("kimi-linear-48b-a3b-instruct", gpu_mem_bytes=8 * 2**30)
    latent = next(s for s in request.layers.values() if isinstance(s, MLASpec))
    kda = state(request)
    state_bytes = 3 * 12288 * 2 + 32 * 128 * 128 * 4
    block = 128 * math.ceil(state_bytes / (128 * 1152))
    assert (latent.block_size, latent.page_size_bytes) == (1920, 1920 * 1152)
    assert (block, kda.block_size, kda.page_size_padded) == (1920, 1920, 1920 * 1152)
    assert kda.num_prefill_checkpoint_blocks == 0
    plan = hp.plan(request)
    hp.check_plan(plan, request=request)


@pytest.mark.parametrize(("name", "page", "checkpoints"), [
    # Mamba-1: conv [4 - 1, 512] + temporal [512, 16], bf16: 3072 + 16384 bytes.
    ("mamba-small", 3 * 512 * 2 + 512 * 16 * 2, 0),
    ("falcon-mamba-small", 3 * 512 * 2 + 512 * 16 * 2, 0),
    # Mamba-2: conv [3, 512 + 2 * 2 groups * 64] + temporal [8 heads, 64, 64], bf16.
    ("mamba2-small", 3 * 768 * 2 + 8 * 64 * 64 * 2, 1),
])
def test_mamba_layers_alone_plan_as_vllm_builds_them(name: str, page: int,
                                                     checkpoints: int) -> None:
    """Issue 40: a model of Mamba layers alone. vLLM 0.34's meta build of these configs
    (transformers' MambaConfig, FalconMambaConfig and Mamba2Config at small sizes) gave, at
    max_model_len 4096: MambaSpec pages of 19456 and 70144 bytes, block_size 4096 (an
    attention-free model runs without prefix caching: one state block of max_model_len),
    mamba_cache_mode none, no padded page, one prefill checkpoint block for MambaMixer2."""
    request = reader_request(name, use_transformers=False)
    specs = list(request.layers.values())
    assert len(specs) == 4
    assert all(isinstance(spec, MambaSpec) for spec in specs)
    spec = specs[0]
    assert isinstance(spec, MambaSpec)
    assert (spec.page_size_bytes, spec.block_size, spec.page_size_padded) == (page, 4096, None)
    assert spec.num_prefill_checkpoint_blocks == checkpoints
    assert request.model.mamba_cache_mode in (None, "none")
    plan = hp.plan(request)
    hp.check_plan(plan, request=request)
    # No length in these configs: vLLM's _get_and_verify_max_len takes 2048, or the one chosen.
    arch = load_config_file(CONFIGS / name / "config.json", use_transformers=False)
    assert build_request(arch, Settings()).model.max_model_len == 2048
    assert build_request(arch, Settings(max_model_len=65536)).model.max_model_len == 65536
    with pytest.raises(ConfigError, match=r"prefix_caching: vLLM 0\.34 does not cache"):
        build_request(arch, Settings(max_model_len=4096, prefix_caching=True))


def test_zamba2_numbers_its_shared_blocks_caches_as_vllm_does() -> None:
    """Issue 40: Zamba2's k-th hybrid layer keeps its cache in block k % M's Attention
    `model.attn.{j}`, j = b * (H + M - 1) // M + k // M. vLLM 0.34's meta build of a Zamba2Config
    with hybrid layers 0, 2, 4, 5, 8 and num_mem_blocks 3 named them model.attn.0 to 4 in that
    order, before every mixer `{5 + i}.mixer`, and agreed layer by layer with this reading."""
    from hisparse_plan.presets.families.zamba2 import attention_slots

    assert attention_slots([0, 2, 4, 5, 8], 3) == {0: 0, 2: 2, 4: 4, 5: 1, 8: 3}
    # The fixture: hybrid layers 2, 5, 7 over 2 blocks (start of block 1: (3 + 1) // 2 = 2).
    assert attention_slots([2, 5, 7], 2) == {2: 0, 5: 2, 7: 1}
    request = reader_request("zamba2-small", use_transformers=False)
    assert list(request.layers)[:4] == ["model.attn.0", "model.attn.1", "model.attn.2",
                                        "3.mixer"]
    attention = request.layers["model.attn.0"]
    # 4 KV heads (the query heads) of 2 * 256 / 4 = 128, whatever num_key_value_heads says.
    assert (attention.num_kv_heads, attention.head_size) == (4, 128)  # type: ignore[union-attr]
    with pytest.raises(ConfigError, match=r"pp: vLLM 0\.34's model for this architecture"):
        build_request(load_config_file(CONFIGS / "zamba2-small" / "config.json",
                                       use_transformers=False),
                      Settings(max_model_len=4096, pp=2))


@pytest.mark.parametrize("use_transformers", [False, True], ids=["fallback", "transformers"])
def test_smollm3_reads_layer_types_as_transformers_derives_them(use_transformers: bool) -> None:
    """Issue 40: SmolLM3 (vLLM's Transformers backend) slides only where layer_types says so;
    transformers' SmolLM3Config derives it from use_sliding_window, sliding_window and the NoPE
    layers, and max_window_layers (in the published config) changes nothing."""
    if use_transformers and not transformers_available():
        pytest.skip("transformers is not installed")
    fields = {**config("smollm3-small"), "max_window_layers": 1}
    arch = model_from_config(fields, origin="smollm3", use_transformers=use_transformers)
    assert isinstance(arch, RegularArchitecture)
    assert arch.layer_kinds() == ["full"] * 4
    # A window on: the NoPE layers (no_rope_layers [1, 1, 1, 0]) slide.
    fields.update(use_sliding_window=True, sliding_window=512)
    arch = model_from_config(fields, origin="smollm3", use_transformers=use_transformers)
    assert isinstance(arch, RegularArchitecture)
    assert arch.layer_kinds() == ["full", "full", "full", "sliding"]


@pytest.mark.parametrize("architecture", ["Dots1ForCausalLM", "BambaForCausalLM"])
def test_architectures_vllm_retired_are_refused_with_its_reason(architecture: str) -> None:
    """Issue 40: vLLM 0.34's registry refuses these (`_PREVIOUSLY_SUPPORTED_MODELS`: supported
    until v0.23.0); the reader says so instead of naming a field vLLM never reads."""
    fields = {**config("llama-3.1-8b-instruct"), "architectures": [architecture],
              "max_window_layers": 61, "use_sliding_window": False}
    with pytest.raises(ConfigError, match=rf"vLLM 0\.34 does not serve {architecture}: it was "
                                          r"supported until vLLM v0\.23\.0") as caught:
        model_from_config(fields, origin="retired", use_transformers=False)
    assert caught.value.field == "architectures"


def test_minicpm3_caches_per_head_keys_whatever_its_kv_head_count() -> None:
    """Issue 40: vLLM's minicpm3.py keeps K and V of num_attention_heads heads of
    qk_nope_head_dim + qk_rope_head_dim (64 + 32 = 96) in every layer; num_key_value_heads and
    the latent rank change nothing (vLLM's meta build: 4 heads of 96, page 64 * 2 * 4 * 96 * 2
    = 98304 bytes at its block of 64)."""
    fields = {**config("minicpm3-small"), "num_key_value_heads": 1, "kv_lora_rank": 512}
    arch = model_from_config(fields, origin="minicpm3", use_transformers=False)
    request = build_request(arch, Settings(max_model_len=4096, block_size=64))
    spec = request.layers["model.layers.0.self_attn.attn"]
    assert (spec.kind, spec.num_kv_heads, spec.head_size) == (  # type: ignore[union-attr]
        "full_attention", 4, 96)
    assert spec.page_size_bytes == 98304
