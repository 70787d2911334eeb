"""The reader's rules for the architectures issue 40's registry sweep added, on the inputs the
sweep's configs do not reach (tests/vllm_registry.json pins each default config to vLLM 0.34's
build): K-EXAONE's per-layer windows, Gemma-4's sharing without a layer to read, GPT-2's own
field names, HRM-Text's recurrence counts. Expected layers are written out by hand here."""

from __future__ import annotations

from typing import Any

import pytest

from hisparse_plan.presets import ConfigError, Settings, build_request
from hisparse_plan.presets.config_file import model_from_config
from hisparse_plan.presets.regular import RegularArchitecture


def exaone_moe(**fields: Any) -> dict[str, Any]:
    return {"model_type": "exaone_moe", "num_hidden_layers": 4, "num_attention_heads": 8,
            "num_key_value_heads": 2, "hidden_size": 1024, "head_dim": 128,
            "max_position_embeddings": 8192, "sliding_window": 4096,
            "layer_types": ["sliding_attention"] * 3 + ["full_attention"], **fields}


def read(config: dict[str, Any]) -> RegularArchitecture:
    arch = model_from_config(config, origin="test", use_transformers=False)
    assert isinstance(arch, RegularArchitecture)
    return arch


def test_k_exaone_reads_each_sliding_layer_window_from_sliding_windows() -> None:
    arch = read(exaone_moe(sliding_windows=[128, 0, 128, 0]))
    # models/exaone_moe.py: a 0 window is no window, so layer 1 is full; layer 3 is full by type.
    assert arch.layer_kinds() == ["sliding", "full", "sliding", "full"]
    assert arch.sliding_window == 128
    request = build_request(arch, Settings(max_model_len=4096))
    windows = [getattr(spec, "sliding_window", None) for spec in request.layers.values()]
    assert windows == [128, None, 128, None]


def test_k_exaone_with_two_windows_is_refused_naming_them() -> None:
    with pytest.raises(ConfigError, match=r"sliding_windows: .*got 128, 256") as caught:
        read(exaone_moe(sliding_windows=[128, 256, 128, 0]))
    assert caught.value.field == "sliding_windows"


def gemma4(**fields: Any) -> dict[str, Any]:
    return {"model_type": "gemma4_text", "num_hidden_layers": 6, "num_attention_heads": 8,
            "num_key_value_heads": 4, "hidden_size": 1536, "head_dim": 256,
            "max_position_embeddings": 32768, "sliding_window": 512, **fields}


def test_gemma4_sharing_with_no_earlier_layer_of_the_type_is_refused() -> None:
    # Six layers: five sliding, the last full (transformers' pattern); with 1 shared, the full
    # layer 5 would read the last full layer before it, and there is none.
    with pytest.raises(ConfigError, match="num_kv_shared_layers: layer 5") as caught:
        read(gemma4(num_kv_shared_layers=1))
    assert caught.value.field == "num_kv_shared_layers"


def test_gemma4_bidirectional_window_is_transformers_halved_window() -> None:
    # transformers' Gemma4TextConfig: sliding_window // 2 + 1 under "all" (512 -> 257).
    assert read(gemma4(use_bidirectional_attention="all")).sliding_window == 257


def test_gpt2_reads_its_own_names_and_a_common_name_wins() -> None:
    config = {"model_type": "gpt2", "n_layer": 3, "n_head": 12, "n_embd": 768,
              "n_positions": 1024}
    arch = read(config)
    assert (arch.num_hidden_layers, arch.head_size, arch.max_position_embeddings) == (
        3, 64, 1024)
    assert read({**config, "num_hidden_layers": 2}).num_hidden_layers == 2
    names = list(build_request(arch, Settings(max_model_len=1024)).layers)
    assert names == [f"transformer.h.{i}.attn.attn" for i in range(3)]


def test_hrm_text_with_too_many_recurrences_is_refused() -> None:
    config = {"model_type": "hrm_text", "num_hidden_layers": 4, "num_attention_heads": 8,
              "num_key_value_heads": 8, "hidden_size": 1024, "head_dim": 128,
              "max_position_embeddings": 4096, "H_cycles": 1000, "L_cycles": 1000}
    with pytest.raises(ConfigError, match=r"num_layers_per_stack: .*got 4004000"):
        read(config)
