"""A `config.json` read through transformers' own config class for its `model_type` (the
optional `hf` extra), offline: the class is built from the dict, nothing is downloaded.

What comes back is the language model's fields as transformers hands them to vLLM: its
defaults for fields the file leaves out (Gemma-3 as the Hub ships it names neither its heads nor
its head size) and the per-layer `layer_types` it derives (Qwen2's `use_sliding_window`, Gemma-3's
`sliding_window_pattern`, ...). Fields of the file that the class drops or renames (Nemotron-H's
`hybrid_override_pattern`) are kept under their own names, the class's values winning where
both exist. None when transformers is not installed or has no class for the `model_type`, or
vLLM reads that type with its own class.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any, Final

from hisparse_plan.presets.errors import ConfigError

ALIASES: Final = {"kimi_k2": "deepseek_v3"}
"""model_types vLLM reads with another type's class (its `_CONFIG_REGISTRY`)."""
VLLM_OWN_CLASSES: Final = frozenset({"kimi_linear"})
"""model_types vLLM reads with a config class of its own (`_CONFIG_REGISTRY`), not
transformers': their family readers apply that class's defaults (`families`)."""


def transformers_available() -> bool:
    try:
        importlib.import_module("transformers")
    except ImportError:
        return False
    return True


def transformers_text_fields(config: Mapping[str, Any], origin: str) -> dict[str, Any] | None:
    """The text model's fields as transformers' config class gives them, or None (no
    transformers, or no class for this `model_type`)."""
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not transformers_available():
        return None  # no class to look up: the config is read as it is
    auto = importlib.import_module("transformers.models.auto.configuration_auto")
    logging = importlib.import_module("transformers.utils.logging")
    name = ALIASES.get(model_type, model_type)
    mapping = auto.CONFIG_MAPPING
    if name not in mapping or name in VLLM_OWN_CLASSES:
        return None
    try:
        config_class = mapping[name]
    except ImportError as error:
        # transformers lists the type but cannot import its module: a package that module
        # imports is missing or broken (Gemma-3n's imports timm, which imports torchvision).
        raise ConfigError(
            f"{origin}: model_type: transformers cannot import its config class for "
            f"{model_type!r} ({type(error).__name__}: {_cause(error)}); expected it to "
            "import: install the package named, or remove a broken one it skips when absent",
            field="model_type",
        ) from None
    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        hf_config = config_class.from_dict(dict(config))
    except Exception as error:
        raise ConfigError(
            f"{origin}: transformers' {config_class.__name__} refuses this config: {error}"
        ) from None
    finally:
        logging.set_verbosity(verbosity)
    text = hf_config.get_text_config()
    if not hasattr(text, "to_dict"):
        # The class declares no text sub-config, so transformers hands back the file's own
        # `text_config` value, which vLLM cannot read a model from either.
        raise ConfigError(
            f"{origin}: text_config: transformers' {config_class.__name__} reads no text "
            f"sub-config; expected the language model's fields at the top level, got a "
            f"text_config of type {type(text).__name__}",
            field="text_config",
        )
    fields: dict[str, Any] = text.to_dict()
    raw = config.get("text_config") if text is not hf_config else config
    raw_fields = raw if isinstance(raw, Mapping) else config
    merged = {**raw_fields, **fields}
    if raw_fields.get("model_type") is not None:
        # The file's own type picks vLLM's model code (kimi_k2 read by DeepSeek-V3's class, or
        # a class another library re-registered under a second type, stays what it says).
        merged["model_type"] = raw_fields["model_type"]
    return merged


def _cause(error: BaseException) -> str:
    """The innermost reason of an import error (transformers wraps the real one)."""
    while error.__cause__ is not None:
        error = error.__cause__
    return " ".join(str(error).split())[:200]
