"""Reading a model's own `config.json`."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from hisparse_plan.presets.architecture import ModelArchitecture
from hisparse_plan.presets.errors import ConfigError


def architecture_from_config(config: Mapping[str, Any], *, origin: str) -> ModelArchitecture:
    """The cache-shaping fields of a parsed `config.json`; `origin` names it in refusals.

    Multimodal wrappers keep the language model's fields under `text_config`; those win when
    the top level lacks `num_hidden_layers`.
    """
    text_config = config.get("text_config")
    if "num_hidden_layers" not in config and isinstance(text_config, Mapping):
        config = text_config
    try:
        return ModelArchitecture.model_validate(dict(config))
    except ValidationError as error:
        first = error.errors()[0]
        field = ".".join(str(part) for part in first["loc"])
        missing = first["type"] == "missing"
        # A whole-config check (empty loc) names its field in the message already.
        got = "" if missing or not field else f" (got {first.get('input')!r})"
        message = first["msg"].removeprefix("Value error, ")
        if missing:
            message = "missing; HiSparse plans sparse-attention (DSA) models, whose config has it"
        more = f" (and {error.error_count() - 1} more)" if error.error_count() > 1 else ""
        where = f"{origin}: {field}" if field else origin
        raise ConfigError(f"{where}: {message}{got}{more}", field=field) from None


def load_config_file(path: str | Path) -> ModelArchitecture:
    """Read a `config.json` file (OSError when it cannot be read)."""
    text = Path(path).read_text(encoding="utf-8")
    try:
        config = json.loads(text)
    except json.JSONDecodeError as error:
        raise ConfigError(f"{path}: not JSON ({error.msg} at line {error.lineno})") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: expected a JSON object, got {type(config).__name__}")
    return architecture_from_config(config, origin=str(path))
