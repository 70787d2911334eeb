"""How a KV-cache dtype turns the config's dimensions into row bytes.

`fp8_ds_mla` (FlashMLA's sparse fp8 format) packs one token's latent row as `kv_lora_rank`
fp8 bytes, one float32 scale per 128 of them, and the `qk_rope_head_dim` rotary elements kept
in bfloat16: 512 + 4 * 4 + 64 * 2 = 656 bytes for DeepSeek-V3.2. `bfloat16` stores the latent
row unquantized: (512 + 64) * 2 bytes.

The indexer keys do not follow `--kv-dtype`: the indexer's kernels read an fp8 cache only, so
vLLM always stores `index_head_dim` fp8 bytes plus one float32 scale per 128 of them, as uint8
(128 + 4 = 132 bytes for DeepSeek-V3.2 and GLM-5), whatever dtype the latent rows use.

Regular attention caches take `bfloat16` (the model dtype of every preset) or one of vLLM's fp8
formats, `fp8_e4m3` and `fp8_e5m2`: one byte an element, stored as `uint8` as vLLM stores them,
so an fp8 row is half a bfloat16 one.

vLLM's `--kv-cache-dtype` names (`auto`, `fp8`, `fp8_e4m3`, `fp8_e5m2`, `bfloat16`, and
`fp8_ds_mla`) are turned into these by `resolve_kv_cache_dtype`, per model as vLLM turns them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal, get_args

from hisparse_plan.errors import PlanError
from hisparse_plan.models import DType, dtype_size
from hisparse_plan.presets.architecture import ModelArchitecture

KVDtype = Literal["fp8_ds_mla", "bfloat16", "fp8_e4m3", "fp8_e5m2"]
"""A cache dtype as planned: what one row of a layer holds."""
KV_DTYPES: Final[tuple[KVDtype, ...]] = get_args(KVDtype)
SPARSE_MLA_DTYPES: Final[tuple[KVDtype, ...]] = ("fp8_ds_mla", "bfloat16")
"""What a DeepSeek sparse-MLA latent cache can be (FlashMLA's sparse kernels)."""
REGULAR_DTYPES: Final[tuple[KVDtype, ...]] = ("bfloat16", "fp8_e4m3", "fp8_e5m2")
"""What a regular attention cache can be."""
VLLMKVCacheDtype = Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16", "fp8_ds_mla"]
"""vLLM's `--kv-cache-dtype` values that a plan can take."""
VLLM_KV_CACHE_DTYPES: Final[tuple[VLLMKVCacheDtype, ...]] = get_args(VLLMKVCacheDtype)
MODEL_DTYPE: Final[KVDtype] = "bfloat16"
"""What `auto` means: the model's own dtype, bfloat16 for every preset."""

FP8_TILE: Final = 128
"""Elements that share one float32 scale in the fp8 formats."""
SCALE_BYTES: Final = 4
"""A float32 scale."""
INDEXER_DTYPE: Final[DType] = "uint8"
"""The indexer cache holds packed fp8 keys and their scales as bytes."""


@dataclass(frozen=True, slots=True)
class RowGeometry:
    """One token's bytes for a sparse (source) layer and for an indexer layer."""

    kv_dtype: KVDtype
    head_size: int
    """kv_lora_rank + qk_rope_head_dim: the latent row in elements."""
    dtype: DType
    """What the latent cache tensors hold (`uint8` for the packed fp8 format)."""
    sparse_row_bytes: int
    state_content_bytes: int | None
    """The packed row size, when it is not head_size * dtype size."""
    indexer_head_size: int
    """The indexer row in `indexer_dtype` elements (bytes: it is always packed fp8)."""
    indexer_row_bytes: int
    scales: int
    """float32 scales in one fp8 latent row (0 for bfloat16)."""
    indexer_scales: int
    indexer_dtype: DType = INDEXER_DTYPE


def resolve_kv_cache_dtype(name: str, *, sparse_mla: bool) -> KVDtype:
    """The cache dtype vLLM's `--kv-cache-dtype NAME` gives a model.

    `auto` is the model's dtype (bfloat16). For DeepSeek sparse MLA (`sparse_mla`: V3.2, GLM-5,
    V4) `fp8` and `fp8_e4m3` are FlashMLA's `fp8_ds_mla` rows, and `fp8_e5m2` has no sparse
    kernel; for regular attention `fp8` is `fp8_e4m3` (one byte an element), and `fp8_ds_mla`
    has no meaning.
    """
    if name == "auto":
        return MODEL_DTYPE
    if sparse_mla:
        if name in ("fp8", "fp8_e4m3", "fp8_ds_mla"):
            return "fp8_ds_mla"
        if name == "bfloat16":
            return "bfloat16"
        expected = "auto, fp8 (fp8_ds_mla), fp8_e4m3, fp8_ds_mla or bfloat16"
    else:
        if name == "fp8":
            return "fp8_e4m3"
        for dtype in REGULAR_DTYPES:
            if name == dtype:
                return dtype
        expected = "auto, fp8, fp8_e4m3, fp8_e5m2 or bfloat16"
    kind = "a DeepSeek sparse-MLA cache" if sparse_mla else "a regular attention cache"
    raise PlanError(
        f"kv_cache_dtype: expected {expected} for {kind}, got {name!r}", field="kv_cache_dtype"
    )


def _whole_tiles(arch: ModelArchitecture, field: str, hint: str) -> int:
    value: int = getattr(arch, field)
    if value % FP8_TILE:
        raise PlanError(
            f"{field}: the fp8 cache scales every {FP8_TILE} elements, so expected a multiple "
            f"of {FP8_TILE}, got {value}{hint}",
            field=field,
        )
    return value // FP8_TILE


def row_geometry(arch: ModelArchitecture, kv_dtype: KVDtype) -> RowGeometry:
    """One token's latent and indexer rows for `arch` in `kv_dtype` (fp8_ds_mla or bfloat16)."""
    if kv_dtype not in SPARSE_MLA_DTYPES:
        raise PlanError(
            f"kv_dtype: a DeepSeek sparse-MLA latent cache is fp8_ds_mla or bfloat16, got "
            f"{kv_dtype} (vLLM's --kv-cache-dtype fp8 is fp8_ds_mla for this model)",
            field="kv_dtype",
        )
    indexer_scales = _whole_tiles(arch, "index_head_dim", " (the indexer cache is always fp8)")
    indexer_row = arch.index_head_dim + indexer_scales * SCALE_BYTES
    head_size = arch.kv_lora_rank + arch.qk_rope_head_dim
    if kv_dtype == "bfloat16":
        row = head_size * dtype_size("bfloat16")
        return RowGeometry(
            kv_dtype, head_size, "bfloat16", row, None, indexer_row, indexer_row, 0,
            indexer_scales,
        )
    scales = _whole_tiles(arch, "kv_lora_rank", "; use --kv-dtype bfloat16")
    row = arch.kv_lora_rank + scales * SCALE_BYTES + arch.qk_rope_head_dim * dtype_size("bfloat16")
    return RowGeometry(
        kv_dtype, head_size, "uint8", row, row, indexer_row, indexer_row, scales, indexer_scales
    )
