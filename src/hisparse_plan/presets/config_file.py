"""Reading a model's own `config.json`: a sparse-MLA model's (it has `kv_lora_rank`) or a
regular model's (everything else)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from hisparse_plan.presets.architecture import ModelArchitecture
from hisparse_plan.presets.errors import ConfigError
from hisparse_plan.presets.regular import RegularArchitecture

ArchitectureT = TypeVar("ArchitectureT", bound=BaseModel)
SPARSE_MARKER = "kv_lora_rank"
"""A config with a latent (MLA) row is read as a sparse-MLA model."""


def _text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """Multimodal wrappers keep the language model's fields under `text_config`; those win
    when the top level lacks `num_hidden_layers`."""
    text_config = config.get("text_config")
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
        more = f" (and {error.error_count() - 1} more)" if error.error_count() > 1 else ""
        where = f"{origin}: {field}" if field else origin
        raise ConfigError(f"{where}: {message}{got}{more}", field=field) from None


def architecture_from_config(config: Mapping[str, Any], *, origin: str) -> ModelArchitecture:
    """The sparse-MLA fields of a parsed `config.json`; `origin` names it in refusals."""
    return _validated(
        ModelArchitecture, _text_config(config), origin,
        "HiSparse plans sparse-attention (DSA) models, whose config has it",
    )


def any_architecture_from_config(
    config: Mapping[str, Any], *, origin: str
) -> ModelArchitecture | RegularArchitecture:
    """A sparse-MLA model's fields when the config has `kv_lora_rank`, else a regular one's."""
    fields = _text_config(config)
    if SPARSE_MARKER in fields:
        return architecture_from_config(config, origin=origin)
    return _validated(
        RegularArchitecture, fields, origin,
        "expected in a model's config.json (a regular model's attention geometry)",
    )


def load_config_file(path: str | Path) -> ModelArchitecture | RegularArchitecture:
    """Read a `config.json` file (OSError when it cannot be read)."""
    text = Path(path).read_text(encoding="utf-8")
    try:
        config = json.loads(text)
    except json.JSONDecodeError as error:
        raise ConfigError(f"{path}: not JSON ({error.msg} at line {error.lineno})") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: expected a JSON object, got {type(config).__name__}")
    return any_architecture_from_config(config, origin=str(path))
