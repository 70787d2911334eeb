"""Reading a model's own `config.json`: a sparse-MLA model's (a latent row and an indexer) or
a regular model's (everything else, plain MLA included).

A user's config file is read through transformers' config class for its `model_type` when the
`hf` extra is installed (`hf_transformers`), so that defaults and derived per-layer kinds are
transformers'; its layers then follow vLLM's model code for the model's family (`families`),
which refuses any kind-deciding field it does not read. Without transformers a config that
leaves out a field transformers would default is refused, naming the field."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, TypeVar

from pydantic import BaseModel, ValidationError

from hisparse_plan.errors import PlanError
from hisparse_plan.models import untrusted_json
from hisparse_plan.models.json_input import excerpt
from hisparse_plan.presets.architecture import ModelArchitecture
from hisparse_plan.presets.errors import ConfigError
from hisparse_plan.presets.families import (
    GENERIC,
    Layout,
    family_of,
    layer_layout,
    refuse_unplanned_early,
    renamed_fields,
)
from hisparse_plan.presets.families.aliases import with_common_names, with_vllm_length
from hisparse_plan.presets.families.layer_names import language_model_prefix
from hisparse_plan.presets.families.transformers_backend import backend_layout
from hisparse_plan.presets.hf_transformers import transformers_text_fields
from hisparse_plan.presets.layer_count import MAX_LAYERS, check_layer_counts
from hisparse_plan.presets.regular import LayerNames, RegularArchitecture
from hisparse_plan.presets.resolution import Resolution, resolve

ArchitectureT = TypeVar("ArchitectureT", bound=BaseModel)
SPARSE_MARKER = "kv_lora_rank"
"""A config with a latent (MLA) row and an indexer is read as a sparse-MLA model."""
INDEXER_FIELDS: Final = ("index_topk", "index_head_dim", "indexer_types", "index_topk_pattern")
SPARSE_TYPES: Final = frozenset({"deepseek_v32", "glm_moe_dsa"})
V4_FIELDS: Final = ("compress_ratios", "compress_rates")
NO_TRANSFORMERS: Final = (
    "transformers would default it; install hisparse-plan[hf] (transformers) to read this config "
    "with transformers' defaults, or add the field"
)


def _text_config(config: Mapping[str, Any], origin: str) -> Mapping[str, Any]:
    """Multimodal wrappers keep the language model's fields under `text_config`; those win
    when the top level lacks `num_hidden_layers`. Every reading starts here, so a config that
    counts absurdly many layers anywhere is refused before anything is built per layer."""
    if not isinstance(config, Mapping):
        raise ConfigError(f"{origin}: expected a config (a JSON object), got "
                          f"{type(config).__name__}", field="config")
    check_layer_counts(config, origin)
    text_config = config.get("text_config")
    thinker = config.get("thinker_config")
    thinker_text = thinker.get("text_config") if isinstance(thinker, Mapping) else None
    if isinstance(thinker_text, Mapping):
        # Qwen2.5-Omni: vLLM serves the thinker alone, its language model built from
        # `thinker_config.text_config` (models/qwen2_5_omni_thinker.py); the talker's and any
        # top-level text_config are not the served model's.
        return thinker_text
    if "num_hidden_layers" not in config and isinstance(text_config, Mapping):
        return text_config
    return config


def _validated(
    model: type[ArchitectureT], config: Mapping[str, Any], origin: str, missing_why: str
) -> ArchitectureT:
    try:
        return model.model_validate(dict(config))
    except ValidationError as error:
        first = error.errors()[0]
        field = ".".join(str(part) for part in first["loc"])
        missing = first["type"] == "missing"
        # A whole-config check (empty loc) names its field in the message already.
        got = "" if missing or not field else f" (got {first.get('input')!r})"
        message = first["msg"].removeprefix("Value error, ")
        if missing:
            message = f"missing; {missing_why}"
        others = [".".join(str(part) for part in e["loc"]) or "(whole config)"
                  for e in error.errors()[1:]]
        more = f" (and {len(others)} more: {', '.join(others)})" if others else ""
        where = f"{origin}: {field}" if field else origin
        raise ConfigError(f"{where}: {message}{got}{more}", field=field) from None


def architecture_from_config(config: Mapping[str, Any], *, origin: str) -> ModelArchitecture:
    """The sparse-MLA fields of a parsed `config.json`; `origin` names it in refusals."""
    return _validated(
        ModelArchitecture, _text_config(config, origin), origin,
        "HiSparse plans sparse-attention (DSA) models, whose config has it",
    )


def any_architecture_from_config(
    config: Mapping[str, Any], *, origin: str
) -> ModelArchitecture | RegularArchitecture:
    """A sparse-MLA model's fields when the config has `kv_lora_rank`, else a regular one's."""
    fields = _text_config(config, origin)
    if SPARSE_MARKER in fields:
        return architecture_from_config(config, origin=origin)
    return _validated(
        RegularArchitecture, fields, origin,
        "expected in a model's config.json (a regular model's attention geometry)",
    )


def is_sparse_mla(fields: Mapping[str, Any]) -> bool:
    """A latent (MLA) row with an indexer: DeepSeek-V3.2, GLM-5."""
    return SPARSE_MARKER in fields and (
        fields.get("model_type") in SPARSE_TYPES
        or any(fields.get(name) is not None for name in INDEXER_FIELDS)
    )


def _is_deepseek_v4(fields: Mapping[str, Any]) -> bool:
    return fields.get("model_type") == "deepseek_v4" or any(name in fields for name in V4_FIELDS)


def _refuse_odd_model_type(fields: Mapping[str, Any], origin: str) -> None:
    """`model_type` picks the model's code (and transformers' class): a name, or absent."""
    model_type = fields.get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        raise ConfigError(f"{origin}: model_type: expected a name such as 'llama', got "
                          f"{type(model_type).__name__}", field="model_type")
    # A name picks a transformers class; a control character is no name any loader knows.
    if isinstance(model_type, str) and not model_type.isprintable():
        raise ConfigError(f"{origin}: model_type: expected a name such as 'llama', got "
                          f"{excerpt(model_type, 60)}", field="model_type")


def model_from_config(
    config: Mapping[str, Any], *, origin: str, use_transformers: bool = True,
    vllm_serves: bool = False,
) -> ModelArchitecture | RegularArchitecture:
    """Any model's cache-shaping fields from its parsed `config.json`, each layer's kind as
    vLLM's model code lays it out; refused, naming the field, when that cannot be told for sure.
    `vllm_serves`: refuse architectures vLLM 0.34 does not know at all, as its registry does
    (a config read for vLLM); otherwise such a config is laid out by its model_type (SGLang
    serves architectures vLLM does not). Retired and out-of-tree ones are refused either way.
    """
    fields = _text_config(config, origin)
    _refuse_odd_model_type(fields, origin)
    # vLLM's registry, then its Transformers backend, then its refusals (`resolution`).
    resolution = resolve(config, origin, unknown=vllm_serves)
    backend = resolution.route in ("transformers_fallback", "transformers_named")
    # DeepSeek-V4 carries an indexer's fields too, but its caches are the compressed ones.
    if is_sparse_mla(fields) and not _is_deepseek_v4(fields) and not backend:
        return architecture_from_config(config, origin=origin)
    hf_fields = transformers_text_fields(config, origin) if use_transformers else None
    missing_why = NO_TRANSFORMERS if fields.get("model_type") else (
        "expected in a model's config.json")
    if hf_fields is not None:
        fields = hf_fields
        missing_why = "expected in a model's config.json (transformers has no default for it)"
    merged = with_vllm_length(with_common_names(fields, use_transformers=use_transformers))
    if "num_nextn_predict_layers" in merged and merged["num_nextn_predict_layers"] is None:
        del merged["num_nextn_predict_layers"]  # transformers 5.25 writes null for "none"
    if _is_deepseek_v4(merged) and not backend:
        return _validated(RegularArchitecture, merged, origin, missing_why)
    try:
        merged = renamed_fields(merged)
    except ConfigError as error:
        raise ConfigError(f"{origin}: {error}", field=error.field) from None
    if "num_key_value_heads" not in merged and "num_attention_heads" in merged:
        # transformers' rule for every model it knows: no field, one KV head per query head.
        merged["num_key_value_heads"] = merged["num_attention_heads"]
    try:
        if not backend:
            refuse_unplanned_early(merged)
    except ConfigError as error:
        raise ConfigError(f"{origin}: {error}", field=error.field) from None
    layers = _layer_count(merged, origin)
    try:
        layout = _layout(merged, layers, resolution)
    except ConfigError as error:
        raise ConfigError(f"{origin}: {error}", field=error.field) from None
    merged.update(layout.fields)
    merged["kinds"], merged["states"] = layout.kinds, layout.states
    merged["kv_sharing"] = dict(layout.reads_cache_of) or None
    merged["layer_heads"] = dict(layout.heads) or None
    # The backend's names are transformers' module paths, from the top of its model.
    prefix = "" if backend else language_model_prefix(config)
    names = {**LayerNames().model_dump(), **layout.names}
    merged["layer_names"] = LayerNames.model_validate({
        key: prefix + value if isinstance(value, str)
        else [prefix + one for one in value] if isinstance(value, list) else value
        for key, value in names.items()})
    return _validated(RegularArchitecture, merged, origin, missing_why)


def _layout(fields: Mapping[str, Any], layers: int, resolution: Resolution) -> Layout:
    """The layers of the class vLLM resolves: the Transformers backend's for a config it
    serves by its fallback, else the model_type's family's."""
    if resolution.route == "transformers_fallback" and resolution.architecture is not None:
        return backend_layout(fields, layers, resolution.backend or {}, resolution.architecture,
                              multimodal="MultiModal" in (resolution.model_class or ""))
    if resolution.route == "transformers_named" and resolution.architecture is not None:
        # The registry names the backend for it: a family written for the model_type
        # (SmolLM3's, Gemma's) reads its kinds, else the backend's rule; the names are the
        # backend's, transformers' module paths, either way.
        found = resolution.backend or {}
        if family_of(str(fields.get("model_type") or "")) is GENERIC:
            return backend_layout(fields, layers, found, resolution.architecture,
                                  multimodal="MultiModal" in (resolution.model_class or ""))
        layout = layer_layout(fields, layers)
        template = found.get("attention")
        if isinstance(template, str):
            names = {**layout.names, "attention": f"model.{template}.attn"}
            return dataclasses.replace(layout, names=names)
        return layout
    return layer_layout(fields, layers)


def _layer_count(fields: Mapping[str, Any], origin: str) -> int:
    """The decoder layer count the layer rules build their lists for."""
    layers = fields.get("num_hidden_layers")
    if not isinstance(layers, int) or isinstance(layers, bool) or not 1 <= layers <= MAX_LAYERS:
        what = ("missing; expected in a model's config.json (its decoder layer count)"
                if layers is None else
                f"expected a positive integer of at most {MAX_LAYERS}, got {layers!r}")
        raise ConfigError(f"{origin}: num_hidden_layers: {what}", field="num_hidden_layers")
    return layers


def read_config_file(path: str | Path, *, label: str | None = None) -> dict[str, Any]:
    """The JSON object of a `config.json` file, read as any untrusted file is
    (`untrusted_json`): ConfigError, naming `label` (default: the path), when it cannot be."""
    try:
        config = untrusted_json.read_json_file(
            path, what="config", label=label, max_bytes=untrusted_json.MAX_CONFIG_BYTES)
    except PlanError as error:
        raise ConfigError(str(error), field=error.field) from None
    screen_config(config, label or str(path))
    return config


MAX_CONFIG_KEYS: Final = 4096
"""Keys a config.json object may have: the Hub's carry a few hundred at most. A config's
unknown keys are normal (each model adds its own), so they cannot be refused one by one; a
flood of them is refused whole, before transformers makes an attribute of each."""


def screen_config(config: Mapping[str, Any], origin: str) -> None:
    """The config, its text_config and vision_config hold at most MAX_CONFIG_KEYS keys each
    (counted: the cost does not grow with them), and no NaN or infinity among their values
    (Python's json reads them; no loader past this one should be handed them)."""
    for where, part in (("", config), ("text_config", config.get("text_config")),
                        ("vision_config", config.get("vision_config"))):
        if not isinstance(part, Mapping):
            continue
        if len(part) > MAX_CONFIG_KEYS:
            raise ConfigError(
                f"{origin}: {where or 'config'}: {len(part)} keys; expected at most "
                f"{MAX_CONFIG_KEYS} (a model's config.json has a few hundred)",
                field=where or "config")
        for key, value in part.items():
            if isinstance(value, float) and not math.isfinite(value):
                field = f"{where}.{key}" if where else str(key)
                raise ConfigError(f"{origin}: {excerpt(field, 80)}: expected a finite number, "
                                  f"got {value}", field=field)


def load_config_file(
    path: str | Path, *, use_transformers: bool = True, label: str | None = None,
    vllm_serves: bool = True,
) -> ModelArchitecture | RegularArchitecture:
    """Read a `config.json` file (`read_config_file`) and the model in it (for vLLM unless
    `vllm_serves` is False: `model_from_config`)."""
    config = read_config_file(path, label=label)
    return model_from_config(config, origin=str(path), use_transformers=use_transformers,
                             vllm_serves=vllm_serves)
