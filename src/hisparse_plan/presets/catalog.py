"""The presets shipped with the package: each a model's `config.json` fields, as package data.

An entry is a sparse-MLA model (planned with HiSparse by default) unless its `"kind"` is
`"regular"`. `"weights"` gives the parameter count and the bits a parameter takes, for the
per-rank weight estimate of a deployment (see `hardware`). `"default_max_model_len"` is the
max_model_len the command plans when none is given: a token count, or `"auto"` (the longest
that fits the memory, up to max_position_embeddings) for a model whose max_position_embeddings
fits no GPU (Llama 4 Scout's 10M tokens); without it, max_position_embeddings.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, Literal

from hisparse_plan.presets.architecture import ModelArchitecture
from hisparse_plan.presets.config_file import (
    any_architecture_from_config,
    architecture_from_config,
)
from hisparse_plan.presets.errors import ConfigError
from hisparse_plan.presets.regular import RegularArchitecture

DATA_FILE = "models.json"
Length = int | Literal["auto"]
"""A max_model_len: tokens, or `auto` (the longest that fits)."""


@dataclass(frozen=True, slots=True)
class Weights:
    """What a model's weights take: `parameters * bits_per_parameter / 8` bytes in all."""

    parameters: int
    bits_per_parameter: str
    """A decimal string (e.g. "4.25"), so that the byte count is exact."""
    source: str


@dataclass(frozen=True, slots=True)
class Preset:
    name: str
    title: str
    description: str
    aliases: tuple[str, ...]
    architecture: ModelArchitecture | RegularArchitecture
    weights: Weights | None = None
    source: str = ""
    """Where the config fields come from."""
    default_max_model_len: Length | None = None
    """The max_model_len planned when none is chosen; None: max_position_embeddings."""

    @property
    def sparse_architecture(self) -> ModelArchitecture | None:
        """The sparse-MLA fields, for a model HiSparse plans; None for a regular model."""
        return self.architecture if isinstance(self.architecture, ModelArchitecture) else None


def _architecture(name: str, entry: dict[str, Any]) -> ModelArchitecture | RegularArchitecture:
    if entry.get("kind", "sparse_mla") == "sparse_mla":
        return architecture_from_config(entry["config"], origin=f"preset {name}")
    return any_architecture_from_config(entry["config"], origin=f"preset {name}")


@cache
def presets() -> dict[str, Preset]:
    """Every shipped preset by its canonical name, in file order."""
    raw = json.loads(
        resources.files("hisparse_plan.presets").joinpath("data", DATA_FILE).read_text("utf-8")
    )
    return {
        name: Preset(
            name=name,
            title=entry["title"],
            description=entry["description"],
            aliases=tuple(entry.get("aliases", ())),
            architecture=_architecture(name, entry),
            weights=Weights(**entry["weights"]) if "weights" in entry else None,
            source=entry.get("source", ""),
            default_max_model_len=_length(name, entry.get("default_max_model_len")),
        )
        for name, entry in raw.items()
    }


def _length(name: str, value: object) -> Length | None:
    if value is None:
        return None
    if value == "auto":
        return "auto"
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    raise ConfigError(
        f"preset {name}: default_max_model_len: expected a token count or 'auto', got {value!r}",
        field="default_max_model_len",
    )


def _key(name: str) -> str:
    return name.strip().lower().replace("_", "-")


def preset_names() -> list[str]:
    return list(presets())


def load_preset(name: str) -> Preset:
    """A preset by name or alias; case, and `_` for `-`, do not matter."""
    wanted = _key(name)
    for preset in presets().values():
        if wanted == preset.name or wanted in (_key(alias) for alias in preset.aliases):
            return preset
    raise ConfigError(
        f"unknown model {name!r}; expected one of {', '.join(preset_names())} "
        "(or --hf-config FILE for another model's config.json)",
        field="model",
    )
