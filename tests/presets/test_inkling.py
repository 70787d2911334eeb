"""Inkling (presets/families/inkling.py): each decoder layer's short-convolution state, kept by
vLLM 0.34 as a sliding-window cache whose one row packs K, V and two residual-stream chunks
(`InklingConvState`, head_size_v 0), before its attention cache. The expected layers are what
vLLM 0.34's InklingForConditionalGeneration built on the meta device for these configs
(references/vllm_family_sweep.py's build), the plan what vLLM 0.34's get_kv_cache_configs gave
for the request (references/vllm_diff.py's harness); the page bytes are worked out by hand."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

import hisparse_plan as hp
from hisparse_plan.adapters.vllm.meta_model import MODEL_FACTS
from hisparse_plan.models import FullAttentionSpec, SlidingWindowSpec
from hisparse_plan.presets import ConfigError, Settings, build_request
from hisparse_plan.presets.config_file import model_from_config


def inkling(**text: Any) -> dict[str, Any]:
    """transformers' InklingConfig defaults that shape a cache (its text config), 4 layers."""
    fields = {"model_type": "inkling_text", "num_hidden_layers": 4, "hidden_size": 6144,
              "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128,
              "swa_num_attention_heads": 64, "swa_num_key_value_heads": 16,
              "swa_head_dim": 128, "sliding_window_size": 512, "conv_kernel_size": 4,
              "local_layer_ids": None, "max_position_embeddings": 131072,
              "layer_types": ["hybrid_sliding"] * 4, **text}
    return {"architectures": ["InklingForConditionalGeneration"], "model_type": "inkling_mm_model",
            "text_config": fields, "vision_config": {}, "audio_config": {}}


def request(config: dict[str, Any], **settings: Any) -> hp.PlanRequest:
    arch = model_from_config(config, origin="test", use_transformers=False)
    return build_request(arch, Settings(max_model_len=4096, **settings))


def facts(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: {key: value for key, value in spec.model_dump(mode="json").items()
                   if key in MODEL_FACTS and value is not None}
            for name, spec in request(config).layers.items()}


def test_every_layer_keeps_a_packed_conv_window_before_its_attention() -> None:
    layers = request(inkling()).layers
    assert list(layers)[:4] == ["model.layers.0.conv_state", "model.layers.0.attn",
                                "model.layers.1.conv_state", "model.layers.1.attn"]
    conv = layers["model.layers.0.conv_state"]
    assert isinstance(conv, SlidingWindowSpec)
    # 2 * 128 + 2 * (6144 / 8) = 1792 elements, rounded up to 2048; no V row.
    assert (conv.block_size, conv.sliding_window, conv.num_kv_heads, conv.head_size,
            conv.head_size_v, conv.dtype) == (4, 4, 8, 2048, 0, "bfloat16")
    assert conv.page_size_bytes == 8 * 4 * 2048 * 2  # 131,072: vLLM's page of this spec
    assert isinstance(layers["model.layers.0.attn"], FullAttentionSpec)


def test_local_layers_as_vllm_034_builds_them() -> None:
    config = inkling(num_hidden_layers=3, layer_types=None, local_layer_ids=[1, 7],
                     swa_head_dim=64, head_dim=96, swa_num_key_value_heads=4,
                     hidden_size=1536, num_attention_heads=16)
    conv = {"kind": "sliding_window", "head_size_v": 0, "dtype": "bfloat16",
            "sliding_window": 4}
    full = {"kind": "full_attention", "num_kv_heads": 8, "head_size": 96, "head_size_v": 96,
            "dtype": "bfloat16"}
    assert facts(config) == {
        # Full layers: 2 * 96 + 2 * (1536 / 8) = 576 -> 1024; local: 2 * 64 + 2 * 384 = 896.
        "model.layers.0.conv_state": {**conv, "num_kv_heads": 8, "head_size": 1024},
        "model.layers.0.attn": full,
        "model.layers.1.conv_state": {**conv, "num_kv_heads": 4, "head_size": 1024},
        "model.layers.1.attn": {"kind": "sliding_window", "num_kv_heads": 4, "head_size": 64,
                                "head_size_v": 64, "dtype": "bfloat16", "sliding_window": 512},
        "model.layers.2.conv_state": {**conv, "num_kv_heads": 8, "head_size": 1024},
        "model.layers.2.attn": full,
    }


def test_the_plan_is_vllm_034s() -> None:
    plan = hp.plan(request(inkling()))
    groups = [(group.layer_names, group.spec.kind, group.spec.block_size,
               group.spec.page_size_bytes) for group in plan.groups]
    assert groups == [
        ([f"model.layers.{i}.conv_state" for i in range(4)], "uniform_type", 4, 4 * 131072),
        ([f"model.layers.{i}.attn" for i in range(4)], "uniform_type", 64,
         4 * 8 * 64 * 256 * 2),
    ]


def test_a_rank_without_a_whole_kv_head_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"tp: .*tp_size <= num_kv_heads.*8 KV heads, got tp "
                                          r"16") as caught:
        request(inkling(), tp=16)
    assert caught.value.field == "tp"


def test_a_float16_model_is_refused() -> None:
    config = inkling()
    config["text_config"]["dtype"] = "float16"
    with pytest.raises(ConfigError, match=r"dtype: .*bfloat16 only") as caught:
        request(config)
    assert caught.value.field == "dtype"


def test_bad_local_layer_ids_are_refused_naming_the_field() -> None:
    with pytest.raises(ConfigError, match="local_layer_ids") as caught:
        request(inkling(local_layer_ids=["0"]))
    assert caught.value.field == "local_layer_ids"


def test_only_a_sliding_window_may_have_no_v_row() -> None:
    assert SlidingWindowSpec(block_size=4, num_kv_heads=2, head_size=8, head_size_v=0,
                             sliding_window=4).page_size_bytes == 2 * 4 * 8 * 2
    with pytest.raises(ValidationError, match="head_size_v"):
        FullAttentionSpec(block_size=4, num_kv_heads=2, head_size=8, head_size_v=0)
