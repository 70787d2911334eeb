"""The layers SGLang 0.5.23 builds for Qwen3-Next: its own Qwen3NextConfig's
`layers_block_type` (configs/qwen3_next.py), every full_attention_interval-th layer attention
and the rest Gated DeltaNet, which models/qwen3_next.py builds the decoder from and which its
pools follow, whatever layer_types the checkpoint's config.json lists. A read-stage rule
(hf_config.read_sglang_config)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from hisparse_plan.errors import UnsupportedRequestError

QWEN3_NEXT: Final = "Qwen3NextForCausalLM"


def sglang_qwen3_next_kinds(config: Mapping[str, Any]) -> list[str]:
    """SGLang's layers_block_type as layer_types names: layer i is full attention when
    (i + 1) is a multiple of full_attention_interval, else linear attention."""
    every = config.get("full_attention_interval")
    layers = config.get("num_hidden_layers")
    if not isinstance(every, int) or isinstance(every, bool) or every < 1 or not isinstance(
            layers, int) or isinstance(layers, bool):
        return []  # the layer reader refuses such a config, naming the field
    return ["full_attention" if (i + 1) % every == 0 else "linear_attention"
            for i in range(layers)]


def refuse_without_interval(config: Mapping[str, Any], architecture: str) -> None:
    """A Qwen3-Next config without full_attention_interval is refused: SGLang's own
    Qwen3NextConfig (configs/qwen3_next.py) takes layer_types and keeps none of it, declares no
    default interval, and its `layers_block_type` (read for the Gated DeltaNet layers' state
    pools, `mamba2_cache_params`) raises AttributeError without one. transformers 5 writes a
    Qwen3-Next config.json with layer_types alone, which vLLM serves and SGLang cannot load."""
    if architecture != QWEN3_NEXT or config.get("full_attention_interval") is not None:
        return
    given = "layer_types alone" if "layer_types" in config else "neither"
    raise UnsupportedRequestError(
        "full_attention_interval: SGLang 0.5.23's Qwen3NextConfig builds Qwen3-Next's layers "
        "from full_attention_interval, has no default for it and does not read layer_types "
        f"(configs/qwen3_next.py, layers_block_type); expected an interval, got {given}",
        field="full_attention_interval",
    )


def refuse_unlike_layer_types(config: Mapping[str, Any], architecture: str) -> None:
    """A Qwen3-Next config whose layer_types (of the right length: transformers refuses
    another) name other layers than SGLang builds is refused: SGLang would size and build its
    interval layers, not the checkpoint's, so the checkpoint's weights do not fit the model it
    serves. A layer_types equal to SGLang's layers is planned; a config without an interval is
    refused first (refuse_without_interval)."""
    refuse_without_interval(config, architecture)
    types = config.get("layer_types")
    if architecture != QWEN3_NEXT or not isinstance(types, list):
        return
    built = sglang_qwen3_next_kinds(config)
    if len(types) != len(built) or types == built:
        return
    first = next(i for i, (a, b) in enumerate(zip(types, built, strict=True)) if a != b)
    raise UnsupportedRequestError(
        f"layer_types[{first}]: SGLang builds Qwen3-Next's layers from "
        f"full_attention_interval (its Qwen3NextConfig.layers_block_type), not layer_types; "
        f"expected {built[first]!r} there (or no layer_types), got {types[first]!r}",
        field=f"layer_types[{first}]",
    )
