"""Config fields that some model types name otherwise, read under the names every family reads.

transformers' config classes map the common names onto their own (`attribute_map`), and
vLLM's code reads the common names through them: GPT-2's and GPT-J's configs (vLLM 0.34's
`models/gpt2.py`, `gpt_j.py`, which read `num_attention_heads` and count `config.n_layer`
layers) keep the layer count in `n_layer`, the heads in `n_head`, the width in `n_embd` and the
context in `n_positions`; BLOOM's (`models/bloom.py`) the layer count and heads. A config
that has the common name as well keeps its own value.
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
}
"""model_type -> common name -> the config's own name (transformers' `attribute_map`)."""


def with_common_names(fields: Mapping[str, Any]) -> dict[str, Any]:
    """`fields` with each common name its model type keeps under another name filled in."""
    named = dict(fields)
    for common, own in ALIASES.get(str(fields.get("model_type")), {}).items():
        if common not in named and own in named:
            named[common] = named[own]
    return named
