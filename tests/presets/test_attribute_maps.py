"""Config field names as transformers' config classes define them (`presets.attribute_maps`):
the stored table is transformers' own, class by class, and the reader reads a checkpoint that
keeps a name only under its class's own field (GPT-2's `n_layer`, JetMoe's `kv_channels`)
with or without transformers installed."""

from __future__ import annotations

import importlib
from typing import Any

import pytest

from hisparse_plan.presets import RegularArchitecture
from hisparse_plan.presets.attribute_maps import attribute_map, table
from hisparse_plan.presets.config_file import model_from_config


def installed_maps() -> tuple[str, dict[str, dict[str, str]], int]:
    """The installed transformers' version, every non-empty class map, and the class count."""
    transformers = pytest.importorskip("transformers")
    configs = importlib.import_module("transformers.models.auto.configuration_auto")
    maps: dict[str, dict[str, str]] = {}
    classes = 0
    for model_type in configs.CONFIG_MAPPING_NAMES:
        try:
            config_class = configs.CONFIG_MAPPING[model_type]
        except Exception:
            continue
        classes += 1
        if found := dict(getattr(config_class, "attribute_map", {})):
            maps[model_type] = found
    return str(transformers.__version__), maps, classes


def test_the_table_is_transformers_own_for_every_config_class() -> None:
    version, maps, classes = installed_maps()
    stored: dict[str, dict[str, str]] = table()["attribute_maps"]
    assert stored, "the table maps names for some classes (GPT-2's n_layer at least)"
    if version == table()["transformers"]:
        # The very version the table was written from (the one CI installs): every class, no
        # more and no fewer (rewrite it with references/vllm_resolution_data.py otherwise).
        assert stored == maps
        assert table()["config_classes"] == classes
    else:
        # Another transformers (the vLLM venv's 5.20): classes come and go and maps gain
        # names between versions, but no name is mapped to another field.
        conflicts = [(model_type, name) for model_type in set(stored) & set(maps)
                     for name in set(stored[model_type]) & set(maps[model_type])
                     if stored[model_type][name] != maps[model_type][name]]
        assert conflicts == [], version


def test_the_table_answers_where_transformers_is_not_used() -> None:
    assert attribute_map("gpt2", use_transformers=False)["num_hidden_layers"] == "n_layer"
    assert attribute_map("jetmoe", use_transformers=False)["head_dim"] == "kv_channels"
    assert attribute_map("bloom", use_transformers=False)["num_attention_heads"] == "n_head"
    assert attribute_map("no-such-type", use_transformers=False) == {}
    # vLLM reads Kimi-Linear with a config class of its own (transformers' maps no name).
    assert attribute_map("kimi_linear", use_transformers=False) == {}


def jetmoe(**more: Any) -> dict[str, Any]:
    """A JetMoe checkpoint as jetmoe/jetmoe-8b ships it: the head size only as kv_channels."""
    return {"architectures": ["JetMoeForCausalLM"], "model_type": "jetmoe", "vocab_size": 32000,
            "hidden_size": 2048, "num_hidden_layers": 24, "num_key_value_heads": 16,
            "num_attention_heads": 32,
            "kv_channels": 128, "num_local_experts": 8, "num_experts_per_tok": 2,
            "max_position_embeddings": 4096, "intermediate_size": 5632,
            "torch_dtype": "bfloat16", **more}


@pytest.mark.parametrize("use_transformers", [False, True], ids=["table", "transformers"])
def test_a_head_size_given_as_kv_channels_is_the_head_size(use_transformers: bool) -> None:
    if use_transformers:
        pytest.importorskip("transformers")
    arch = model_from_config(jetmoe(), origin="jetmoe", use_transformers=use_transformers)
    assert isinstance(arch, RegularArchitecture)
    assert arch.head_size == 128  # kv_channels (2048 / 32 heads would be 64)


def test_a_layer_count_given_as_n_layer_is_counted() -> None:
    config = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_layer": 3,
              "n_head": 4, "n_embd": 256, "n_positions": 1024, "vocab_size": 50257}
    arch = model_from_config(config, origin="gpt2", use_transformers=False)
    assert isinstance(arch, RegularArchitecture)
    assert (arch.num_hidden_layers, arch.head_size, arch.max_position_embeddings) == (
        3, 64, 1024)


def test_nemotron_h_counts_its_layers_block_type_without_num_hidden_layers() -> None:
    # transformers 5's NemotronHConfig derives num_hidden_layers from the list in a property,
    # which to_dict leaves out.
    config = {"architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h",
              "layers_block_type": ["mamba", "attention", "mamba", "moe"],
              "hidden_size": 1024, "num_attention_heads": 8, "num_key_value_heads": 2,
              "head_dim": 128, "max_position_embeddings": 4096, "mamba_num_heads": 16,
              "mamba_head_dim": 64, "ssm_state_size": 128, "n_groups": 2, "conv_kernel": 4,
              "expand": 1, "vocab_size": 1000, "torch_dtype": "bfloat16"}
    arch = model_from_config(config, origin="nemotron_h", use_transformers=False)
    assert isinstance(arch, RegularArchitecture)
    assert arch.num_hidden_layers == 4
