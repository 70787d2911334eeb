"""Config fields that some model types name otherwise, read under the names every family reads.

transformers' config classes map the common names onto their own (`attribute_map`), and
vLLM's code reads the common names through them: GPT-2's and GPT-J's configs (vLLM 0.34's
`models/gpt2.py`, `gpt_j.py`, which count `config.n_layer` layers) keep the layer count in
`n_layer`, the heads in `n_head`; BLOOM's (`models/bloom.py`) the layer count and heads;
JetMoe's its head size in `kv_channels`. Every map is transformers' own
(`presets.attribute_maps`: the installed class's, else the table written from it). A config
that has the common name as well keeps its own value. Two names are vLLM's rather than a
class's: DBRX's KV heads, `attn_config.kv_n_heads` (`DbrxModelArchConfigConvertor`,
transformers_utils/model_arch_config_convertor.py), and a layer count transformers 5 derives
in a property that `to_dict` leaves out (`DERIVED_LAYER_COUNTS`: Nemotron-H counts its
`layers_block_type`).

A model whose config has no context field at all (`WITHOUT_LENGTH`) gets vLLM 0.34's: without
any of the keys `derived_max_model_len_and_key` looks for, `_get_and_verify_max_len`
(config/model.py) takes a chosen max_model_len as it is, else 2048 tokens.
"""


from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from hisparse_plan.presets.attribute_maps import with_mapped_names

NESTED: Final[dict[str, dict[str, str]]] = {
    "dbrx": {"num_key_value_heads": "attn_config.kv_n_heads"},
}
"""model_type -> common name -> a field of a sub-config vLLM reads it from."""
DERIVED_LAYER_COUNTS: Final[dict[str, str]] = {"nemotron_h": "layers_block_type"}
"""model_type -> the per-layer list whose length is the layer count (transformers 5's
`num_hidden_layers` property of the class, which `to_dict` does not write)."""
KIND_FIELDS: Final = frozenset({
    "layer_types", "layers_block_type", "sliding_window", "attn_type_list",
    "hybrid_override_pattern", "layer_block_types", "block_configs",
})
"""Kind-deciding fields that stay under the config's own names: each family reads the name
its model's config uses."""


def _own(fields: Mapping[str, Any], dotted: str) -> Any:  # noqa: ANN401 - a config value
    """The value at a dotted name, or None."""
    value: Any = fields
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return value


def with_common_names(fields: Mapping[str, Any], *, use_transformers: bool = True
                      ) -> dict[str, Any]:
    """`fields` with each common name its model type keeps under another name filled in."""
    named = with_mapped_names(fields, keep=KIND_FIELDS, use_transformers=use_transformers)
    model_type = str(fields.get("model_type"))
    for common, own in NESTED.get(model_type, {}).items():
        if common not in named and (value := _own(named, own)) is not None:
            named[common] = value
    listed = named.get(DERIVED_LAYER_COUNTS.get(model_type, ""))
    if named.get("num_hidden_layers") is None and isinstance(listed, list) and listed:
        named["num_hidden_layers"] = len(listed)
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
