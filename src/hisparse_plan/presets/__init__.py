"""Model presets: the `config.json` fields of known sparse-MLA models, and plan requests built
from them (or from a user's own `config.json`)."""

from hisparse_plan.presets.architecture import ModelArchitecture
from hisparse_plan.presets.catalog import Preset, load_preset, preset_names, presets
from hisparse_plan.presets.config_file import architecture_from_config, load_config_file
from hisparse_plan.presets.errors import ConfigError
from hisparse_plan.presets.kv_dtypes import KV_DTYPES, KVDtype, RowGeometry, row_geometry
from hisparse_plan.presets.request import (
    DEFAULTS,
    INDEXER_LAYER,
    SPARSE_LAYER,
    Settings,
    build_request,
    host_pool_gib,
    override_request,
    shared_host_pool,
)

__all__ = [
    "DEFAULTS",
    "INDEXER_LAYER",
    "KV_DTYPES",
    "SPARSE_LAYER",
    "ConfigError",
    "KVDtype",
    "ModelArchitecture",
    "Preset",
    "RowGeometry",
    "Settings",
    "architecture_from_config",
    "build_request",
    "host_pool_gib",
    "load_config_file",
    "load_preset",
    "override_request",
    "preset_names",
    "presets",
    "row_geometry",
    "shared_host_pool",
]
