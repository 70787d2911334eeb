"""Config fields that some model types name otherwise, read under the names every family reads.

transformers' config classes map the common names onto their own (`attribute_map`), and
vLLM's code reads the common names through them: GPT-2's and GPT-J's configs (vLLM 0.34's
`models/gpt2.py`, `gpt_j.py`, which read `num_attention_heads` and count `config.n_layer`
layers) keep the layer count in `n_layer`, the heads in `n_head`, the width in `n_embd` and the
context in `n_positions`; BLOOM's (`models/bloom.py`) the layer count and heads; DBRX's
(`models/dbrx.py`) all of them, its KV heads in `attn_config`. A config that has the common
name as well keeps its own value.

A model whose config has no context field at all (`WITHOUT_LENGTH`) gets vLLM 0.34's: without
any of the keys `derived_max_model_len_and_key` looks for, `_get_and_verify_max_len`
(config/model.py) takes a chosen max_model_len as it is, else 2048 tokens.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

GPT_NAMES: Final = {
    "num_hidden_layers": "n_layer", "num_attention_heads": "n_head", "hidden_size": "n_embd",
    "max_position_embeddings": "n_positions",
}
ALIASES: Final[dict[str, dict[str, str]]] = {
    "gpt2": GPT_NAMES, "gptj": GPT_NAMES,
    "bloom": {"num_hidden_layers": "n_layer", "num_attention_heads": "n_head"},
    "dbrx": {"num_hidden_layers": "n_layers", "num_attention_heads": "n_heads",
             "hidden_size": "d_model", "max_position_embeddings": "max_seq_len",
             "num_key_value_heads": "attn_config.kv_n_heads"},
}
"""model_type -> common name -> the config's own name (transformers' `attribute_map`; a dotted
name is a field of a sub-config: DBRX's KV heads, `attn_config.kv_n_heads` in `dbrx.py`)."""


def _own(fields: Mapping[str, Any], dotted: str) -> Any:  # noqa: ANN401 - a config value
    """The value at a dotted name, or None."""
    value: Any = fields
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return value


def with_common_names(fields: Mapping[str, Any]) -> dict[str, Any]:
    """`fields` with each common name its model type keeps under another name filled in."""
    named = dict(fields)
    for common, own in ALIASES.get(str(fields.get("model_type")), {}).items():
        if common not in named and (value := _own(named, own)) is not None:
            named[common] = value
    return named



WITHOUT_LENGTH: Final = frozenset({"bloom", "mamba", "falcon_mamba", "mamba2"})
"""Model types whose transformers config class has no context field at all (BLOOM's ALiBi has
no position table; Mamba's states have no length), so vLLM finds none in any checkpoint's."""
VLLM_DEFAULT_LENGTH: Final = 2048


def with_vllm_length(fields: Mapping[str, Any]) -> dict[str, Any]:
    """`fields` with vLLM's context for a model type WITHOUT_LENGTH whose config names none:
    2048 tokens, or a chosen max_model_len as it is (`length_assumed`)."""
    named = dict(fields)
    if named.get("max_position_embeddings") is None and (
            named.get("model_type") in WITHOUT_LENGTH):
        named.update(max_position_embeddings=VLLM_DEFAULT_LENGTH, length_assumed=True)
    return named
