"""Refusals of a model name or a config file."""

from __future__ import annotations

from hisparse_plan.errors import PlanError


class ConfigError(PlanError):
    """An unknown preset, or a `config.json` without the fields a sparse-MLA cache needs."""
