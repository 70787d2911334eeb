"""The presets shipped with the package: each a model's `config.json` fields, as package data.

An entry is a sparse-MLA model (planned with HiSparse by default) unless its `"kind"` is
`"regular"`. `"weights"` gives the parameter count and the bits a parameter takes, for the
per-rank weight estimate of a deployment (see `hardware`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from hisparse_plan.presets.architecture import ModelArchitecture
from hisparse_plan.presets.config_file import (
    any_architecture_from_config,
    architecture_from_config,
)
from hisparse_plan.presets.errors import ConfigError
from hisparse_plan.presets.regular import RegularArchitecture

DATA_FILE = "models.json"


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
        )
        for name, entry in raw.items()
    }


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
