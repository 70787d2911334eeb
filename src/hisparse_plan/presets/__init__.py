"""Model presets: known models' `config.json` fields, and plan requests built from them or from a
user's own `config.json`. May import models only.

Sparse-MLA models (DeepSeek-V3.2, GLM-5) plan with HiSparse unless told not to; regular models
(Llama, Gemma, gpt-oss, Qwen3-Next, DeepSeek-V4-Flash) without.
"""

from hisparse_plan.presets.architecture import ModelArchitecture
from hisparse_plan.presets.catalog import Preset, Weights, load_preset, preset_names, presets
from hisparse_plan.presets.config_file import architecture_from_config, load_config_file
from hisparse_plan.presets.errors import ConfigError
from hisparse_plan.presets.kv_dtypes import KV_DTYPES, KVDtype, RowGeometry, row_geometry
from hisparse_plan.presets.regular import RegularArchitecture
from hisparse_plan.presets.request import (
    INDEXER_LAYER,
    SPARSE_LAYER,
    Architecture,
    build_request,
    override_request,
)
from hisparse_plan.presets.settings import (
    DEFAULTS,
    Settings,
    context_length,
    host_pool_gib,
    shared_host_pool,
)
from hisparse_plan.presets.stages import pp_partition

__all__ = [
    "DEFAULTS",
    "INDEXER_LAYER",
    "KV_DTYPES",
    "SPARSE_LAYER",
    "Architecture",
    "ConfigError",
    "KVDtype",
    "ModelArchitecture",
    "Preset",
    "RegularArchitecture",
    "RowGeometry",
    "Settings",
    "Weights",
    "architecture_from_config",
    "build_request",
    "context_length",
    "host_pool_gib",
    "load_config_file",
    "load_preset",
    "override_request",
    "pp_partition",
    "preset_names",
    "presets",
    "row_geometry",
    "shared_host_pool",
]
