"""How many bytes a model's weights take, for a deployment's HBM split (`hardware`), from the
best source at hand:

1. bytes the operator gives (`--weights-bytes`);
2. `model.safetensors.index.json` beside the `config.json`: its `metadata.total_size` is the
   checkpoint's tensor bytes, exactly (quantization scales included);
3. a parameter count (`--parameters`, or a preset's) times the bits one parameter takes: from
   the config's `quantization_config` when it has one (fp8: 8, mxfp4: 4.25, a `bits` field:
   that many), else its `torch_dtype` as vLLM loads it (16 for bfloat16 / float16 and for
   float32 too, which vLLM serves in 16 bits).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from hisparse_plan.errors import PlanError
from hisparse_plan.models.untrusted_json import read_json_file
from hisparse_plan.presets.catalog import Weights
from hisparse_plan.presets.errors import ConfigError

INDEX_FILE: Final = "model.safetensors.index.json"
QUANT_BITS: Final = {"fp8": "8", "mxfp4": "4.25", "fbgemm_fp8": "8", "compressed-tensors": None}
"""Bits a parameter takes under each `quant_method` (None: read its `bits`, if any)."""
DTYPE_BITS: Final = {"bfloat16": "16", "float16": "16", "float32": "16"}


@dataclass(frozen=True, slots=True)
class ModelWeights:
    """The whole model's weight bytes (all ranks together) and where the figure comes from."""

    total_bytes: int
    source: str


def index_weights(config_path: Path) -> ModelWeights | None:
    """`metadata.total_size` of the safetensors index beside `config_path`, if there is one."""
    index = config_path.parent / INDEX_FILE
    if not index.exists():  # one that exists but is no regular file is refused, not skipped
        return None
    try:
        data = read_json_file(index, what="safetensors index")
    except PlanError as error:
        raise ConfigError(f"not a readable safetensors index: {error}", field="weights"
                          ) from None
    metadata = data.get("metadata")
    total = metadata.get("total_size") if isinstance(metadata, dict) else None
    if not isinstance(total, int) or isinstance(total, bool) or total <= 0:
        raise ConfigError(
            f"{index}: metadata.total_size: expected the checkpoint's bytes (a positive "
            f"integer), got {total!r}",
            field="weights",
        )
    return ModelWeights(total, f"{INDEX_FILE} metadata.total_size")


def bits_per_parameter(config: Mapping[str, Any]) -> str:
    """The bits one parameter takes, from `quantization_config`, else `torch_dtype`."""
    quant = config.get("quantization_config")
    if isinstance(quant, Mapping):
        method = quant.get("quant_method")
        bits = quant.get("bits")
        if isinstance(bits, int) and not isinstance(bits, bool) and bits > 0:
            return str(bits)
        known = QUANT_BITS.get(str(method))
        if known is not None:
            return known
        raise ConfigError(
            f"quantization_config: quant_method {method!r} has no bits per parameter known "
            "here; give --weights-bytes (or a model.safetensors.index.json)",
            field="quantization_config",
        )
    dtype = config.get("torch_dtype") or config.get("dtype") or "bfloat16"
    if str(dtype) not in DTYPE_BITS:
        raise ConfigError(
            f"torch_dtype: expected one of {', '.join(DTYPE_BITS)}, got {dtype!r}; give "
            "--weights-bytes",
            field="torch_dtype",
        )
    return DTYPE_BITS[str(dtype)]


def counted_weights(parameters: int, config: Mapping[str, Any]) -> Weights:
    bits = bits_per_parameter(config)
    return Weights(parameters, bits, f"{parameters} parameters x {bits} bits (config.json)")
