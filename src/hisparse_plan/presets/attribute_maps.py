"""Config field names as transformers' config classes define them.

A transformers config class answers some names with another field (`attribute_map`: GPT-2's
`num_hidden_layers` is its `n_layer`, JetMoe's `head_dim` its `kv_channels`, BLOOM's
`num_attention_heads` its `n_head`), and vLLM's code reads those names through the class, so a
checkpoint that stores only the class's own name is read under the common one. Where
transformers is installed the class's own `attribute_map` is read; otherwise the table
data/transformers_attribute_maps.json, written from transformers by
references/vllm_resolution_data.py (tests/presets/test_attribute_maps.py checks it against the
installed
transformers, class by class).
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Mapping
from functools import cache
from importlib import resources
from typing import Any, Final

from hisparse_plan.presets.hf_transformers import ALIASES, VLLM_OWN_CLASSES

TABLE_FILE: Final = "transformers_attribute_maps.json"


@cache
def table() -> dict[str, Any]:
    """The stored table: the transformers version, how many classes, and the maps."""
    text = resources.files("hisparse_plan.presets").joinpath("data", TABLE_FILE).read_text(
        "utf-8")
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def _installed_map(model_type: str) -> dict[str, str] | None:
    """The installed transformers' class's map, or None (no transformers, no such class, or
    a class whose module cannot be imported)."""
    try:
        auto = importlib.import_module("transformers.models.auto.configuration_auto")
    except ImportError:
        return None
    if model_type not in auto.CONFIG_MAPPING_NAMES:
        return None
    try:
        config_class = auto.CONFIG_MAPPING[model_type]
    except Exception:  # a class transformers lists but cannot import: the table answers
        return None
    found = getattr(config_class, "attribute_map", None)
    return dict(found) if isinstance(found, Mapping) else {}


def attribute_map(model_type: str, *, use_transformers: bool = True) -> dict[str, str]:
    """Name a reader asks for -> the field transformers' class for `model_type` keeps it in
    (the installed class's when `use_transformers` and transformers has it, else the table's;
    empty for a type neither knows, and for one vLLM reads with a config class of its own:
    `hf_transformers.VLLM_OWN_CLASSES`; a type vLLM reads with another's class, that one's)."""
    if model_type in VLLM_OWN_CLASSES:
        return {}
    model_type = ALIASES.get(model_type, model_type)
    if use_transformers and (installed := _installed_map(model_type)) is not None:
        return installed
    maps: dict[str, dict[str, str]] = table()["attribute_maps"]
    return dict(maps.get(model_type, {}))


def with_mapped_names(fields: Mapping[str, Any], *, keep: frozenset[str],
                      use_transformers: bool = True) -> dict[str, Any]:
    """`fields` with each name of its class's attribute map filled from the field the class
    keeps it in, where the config lacks the name; names in `keep` (the kind-deciding fields
    families read under the config's own names) are left as they are."""
    named = dict(fields)
    model_type = fields.get("model_type")
    if not isinstance(model_type, str):
        return named
    for name, own in attribute_map(model_type, use_transformers=use_transformers).items():
        if name in keep or own in keep:
            continue
        if named.get(name) is None and named.get(own) is not None:
            named[name] = named[own]
    return named
