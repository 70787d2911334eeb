"""The presets shipped with the package: each a model's `config.json` fields, as package data."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources

from hisparse_plan.presets.architecture import ModelArchitecture
from hisparse_plan.presets.config_file import architecture_from_config
from hisparse_plan.presets.errors import ConfigError

DATA_FILE = "models.json"


@dataclass(frozen=True, slots=True)
class Preset:
    name: str
    title: str
    description: str
    aliases: tuple[str, ...]
    architecture: ModelArchitecture


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
            architecture=architecture_from_config(entry["config"], origin=f"preset {name}"),
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
