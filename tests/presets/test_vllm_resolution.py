"""vLLM 0.34's model resolution as the config reader follows it (`presets.resolution`): the
registry, then the Transformers modeling backend, then the refusals; and the layers the backend
builds (`families.transformers_backend`), checked against figures worked out by hand from the
published configs. Where vLLM is installed, the stored registry names are checked against its
registry."""

from __future__ import annotations

from typing import Any

import pytest

from hisparse_plan.presets import ConfigError, RegularArchitecture, Settings, build_request
from hisparse_plan.presets.config_file import model_from_config
from hisparse_plan.presets.resolution import data, resolve, vllm_model_class

DOTS1 = {
    "architectures": ["Dots1ForCausalLM"], "model_type": "dots1", "first_k_dense_replace": 1,
    "head_dim": 128, "hidden_size": 4096, "intermediate_size": 10944,
    "max_position_embeddings": 32768, "max_window_layers": 62, "moe_intermediate_size": 1408,
    "n_routed_experts": 128, "n_shared_experts": 2, "num_attention_heads": 32,
    "num_experts_per_tok": 6, "num_hidden_layers": 62, "num_key_value_heads": 32,
    "sliding_window": None, "torch_dtype": "bfloat16", "use_sliding_window": False,
    "vocab_size": 152064,
}
"""rednote-hilab/dots.llm1.inst's config.json, its cache-shaping fields."""
PERSIMMON = {
    "architectures": ["PersimmonForCausalLM"], "model_type": "persimmon", "hidden_size": 4096,
    "max_position_embeddings": 16384, "num_attention_heads": 64, "num_hidden_layers": 36,
    "partial_rotary_factor": 0.5, "torch_dtype": "bfloat16", "vocab_size": 262144,
}
"""adept/persimmon-8b-base's config.json, its cache-shaping fields."""


def layers(config: dict[str, Any], *, use_transformers: bool = False) -> dict[str, Any]:
    arch = model_from_config(config, origin="test", use_transformers=use_transformers)
    request = build_request(arch, Settings(max_model_len=4096))
    return {name: spec.model_dump(mode="json", exclude_none=True)
            for name, spec in request.layers.items()}


def test_a_retired_name_is_served_by_the_transformers_backend_when_transformers_can() -> None:
    # Dots1ForCausalLM is in _PREVIOUSLY_SUPPORTED_MODELS, but the registry does not name it,
    # so the backend is tried first: transformers' Dots1ForCausalLM, experts -> MoE.
    assert vllm_model_class(DOTS1) == "TransformersMoEForCausalLM"
    assert vllm_model_class(PERSIMMON) == "TransformersForCausalLM"
    assert resolve(DOTS1, "t").route == "transformers_fallback"


def test_the_registry_comes_first_and_names_the_backend_for_some() -> None:
    llama = {"architectures": ["LlamaForCausalLM"]}
    assert (resolve(llama, "t").route, vllm_model_class(llama)) == ("registry",
                                                                   "LlamaForCausalLM")
    gemma = {"architectures": ["GemmaForCausalLM"]}
    assert (resolve(gemma, "t").route, vllm_model_class(gemma)) == (
        "transformers_named", "TransformersForCausalLM")
    # The first architecture the registry names wins, even after one it does not.
    both = {"architectures": ["NoSuchForCausalLM", "LlamaForCausalLM"]}
    assert vllm_model_class(both) == "LlamaForCausalLM"
    assert resolve({"model_type": "llama"}, "t").route == "unnamed"


@pytest.mark.parametrize(("arch", "said"), [
    ("XverseForCausalLM", r"does not serve XverseForCausalLM: it was supported until vLLM "
                          r"v0\.23\.0"),
    ("BartForConditionalGeneration", r"only through the plugin https://github\.com/"
                                     r"vllm-project/bart-plugin"),
    ("NoSuchForCausalLM", r"serves none of NoSuchForCausalLM"),
])
def test_what_vllm_refuses_is_refused_with_vllms_reason(arch: str, said: str) -> None:
    config = {**PERSIMMON, "architectures": [arch]}
    with pytest.raises(ConfigError, match=said) as caught:
        model_from_config(config, origin="t", use_transformers=False, vllm_serves=True)
    assert caught.value.field == "architectures"


def test_an_architecture_only_other_engines_know_is_read_by_model_type_when_not_for_vllm() -> None:
    # SGLang serves names vLLM's registry lacks (its EAGLE drafts): read by model_type there.
    config = {**PERSIMMON, "model_type": "llama", "architectures": ["LlamaForCausalLMEagle"]}
    arch = model_from_config(config, origin="t", use_transformers=False)
    assert isinstance(arch, RegularArchitecture)
    assert arch.num_hidden_layers == 36
    with pytest.raises(ConfigError, match="serves none of LlamaForCausalLMEagle"):
        model_from_config(config, origin="t", use_transformers=False, vllm_serves=True)
    # Retired names stay refused either way.
    with pytest.raises(ConfigError, match="does not serve XverseForCausalLM"):
        model_from_config({**config, "architectures": ["XverseForCausalLM"]}, origin="t",
                          use_transformers=False)


def test_dots1_is_planned_as_the_backend_builds_it() -> None:
    # 62 decoder layers, each one Attention at transformers' path layers.{i}.self_attn:
    # 32 KV heads of head_dim 128, full attention (no layer_types says sliding).
    found = layers({**DOTS1, "layer_types": ["full_attention"] * 62})
    assert list(found) == [f"model.layers.{i}.self_attn.attn" for i in range(62)]
    assert {(s["kind"], s["num_kv_heads"], s["head_size"]) for s in found.values()} == {
        ("full_attention", 32, 128)}


def test_dots1_without_layer_types_is_read_through_transformers_or_refused() -> None:
    # The backend reads transformers' layer_types, which Dots1Config derives from
    # use_sliding_window and max_window_layers: without transformers that cannot be told.
    with pytest.raises(ConfigError, match="max_window_layers"):
        layers(DOTS1)
    pytest.importorskip("transformers")
    found = layers(DOTS1, use_transformers=True)
    assert len(found) == 62
    assert {spec["kind"] for spec in found.values()} == {"full_attention"}


def test_persimmon_heads_are_hidden_size_over_heads() -> None:
    found = layers(PERSIMMON)
    assert len(found) == 36
    # No num_key_value_heads: one KV head per query head; 4096 / 64 = 64 wide.
    assert {(s["num_kv_heads"], s["head_size"]) for s in found.values()} == {(64, 64)}


def test_the_backend_names_layers_by_transformers_module_path() -> None:
    # GPT-NeoX's attention module is `attention`, GPT-BigCode's `h.{i}.attn` (the registry
    # names the backend for both).
    neox = {"architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox",
            "hidden_size": 512, "num_attention_heads": 8, "num_hidden_layers": 2,
            "max_position_embeddings": 4096, "vocab_size": 1000}
    assert list(layers(neox)) == ["model.layers.0.attention.attn", "model.layers.1.attention.attn"]
    bigcode = {"architectures": ["GPTBigCodeForCausalLM"], "model_type": "gpt_bigcode",
               "n_embd": 512, "n_head": 8, "n_layer": 2, "n_positions": 4096,
               "vocab_size": 1000, "multi_query": True}
    assert list(layers(bigcode)) == ["model.h.0.attn.attn", "model.h.1.attn.attn"]


def test_a_backend_model_with_kv_lora_rank_keeps_mla_rows() -> None:
    # LongcatFlash-like MLA served by the backend: a module with kv_b_proj and kv_lora_rank ->
    # MLAAttention, one row of kv_lora_rank + qk_rope_head_dim = 512 + 64.
    found_mla = next(arch for arch, entry in data()["backend"].items()
                     if entry.get("mla") and entry.get("attention") == "layers.{i}.self_attn"
                     and arch not in data()["registry"])
    config = {"architectures": [found_mla], "model_type": "unknown_mla", "hidden_size": 1024,
              "num_attention_heads": 8, "num_hidden_layers": 3, "kv_lora_rank": 512,
              "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
              "max_position_embeddings": 4096, "vocab_size": 1000, "torch_dtype": "bfloat16"}
    arch = model_from_config(config, origin="t", use_transformers=False)
    assert isinstance(arch, RegularArchitecture)
    found = layers(config)
    assert {(s["kind"], s["head_size"]) for s in found.values()} == {("mla", 576)}


def test_a_layer_the_backend_cannot_serve_is_refused() -> None:
    # Linear-attention layers dispatch through no attention interface: vLLM refuses the model.
    config = {**PERSIMMON, "num_hidden_layers": 2,
              "layer_types": ["linear_attention", "full_attention"]}
    with pytest.raises(ConfigError, match="linear_attention"):
        layers(config)


def test_the_stored_registry_is_vllms() -> None:
    pytest.importorskip("vllm")
    from vllm.model_executor.models import registry  # type: ignore[import-not-found, unused-ignore]

    stored = data()
    assert set(stored["registry"]) == set(registry.ModelRegistry.models)
    assert stored["retired"] == registry._PREVIOUSLY_SUPPORTED_MODELS
    assert stored["out_of_tree"] == registry._OOT_SUPPORTED_MODELS
    assert stored["transformers_supported"] == sorted(registry._TRANSFORMERS_SUPPORTED_MODELS)
