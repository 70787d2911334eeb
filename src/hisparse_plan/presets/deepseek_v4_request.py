"""A plan request for a DeepSeek-V4 model: the KV caches vLLM 0.33 registers for it, in its
order and with its names, with its default fp8_ds_mla cache (the FlashMLA sparse backend).

Per decoder layer `i` (prefix `model.layers.{i}.attn`), by its compress ratio (`regular`):
- ratio 4: `.indexer.k_cache` (mla, the indexer keys: `index_head_dim` fp8 bytes and a float32
  scale per 128, one row per 4 tokens), `.indexer.compressor.state_cache` (the indexer
  compressor's state), `.swa_cache`, the layer itself (the compressed latent cache, one row
  per 4 tokens) and `.compressor.state_cache`;
- ratio 128: `.swa_cache`, the layer itself (one row per 128 tokens), `.compressor.state_cache`;
- no compression: `.swa_cache` alone.

Sizes, as vLLM 0.33's DeepSeek-V4 modules set them:
- a latent row (sliding-window and compressed caches) is 584 bytes: 448 fp8 NoPE values, 64
  bfloat16 RoPE values and 8 scale bytes; every fp8_ds_mla page is padded to a multiple of 576;
- the sliding-window cache keeps 64-token blocks (`DeepseekV4SWACache`); the compressed caches
  and indexer keys use the cache block size vLLM's config step picks, 256 tokens (the FlashMLA
  sparse and DeepSeek-V4 indexer kernels take only 256-token blocks);
- a compressor state holds float32 kv and score rows of `2 * coff * dim` values, `coff` = 2
  when ratio-4 windows overlap (else 1), over a window of `coff * ratio` tokens, in blocks of 4
  tokens (ratio 4) or 8 (ratio 128); `dim` is `head_dim` for the attention compressor and
  `index_head_dim` for the indexer's.

vLLM registers no cache for the MTP layer unless speculative decoding is configured; neither
does this preset.
"""

from __future__ import annotations

from typing import Any, Final

from hisparse_plan.models import PlanRequest
from hisparse_plan.presets.errors import ConfigError
from hisparse_plan.presets.regular import RegularArchitecture
from hisparse_plan.presets.regular_request import refuse_unplannable, regular_plan_request
from hisparse_plan.presets.settings import Settings, context_length

KV_DTYPE: Final = "fp8_ds_mla"
LAYER: Final = "model.layers.{}.attn"
HEAD_DIM: Final = 512
ROPE_DIM: Final = 64
ROW_BYTES: Final = 584
"""448 fp8 NoPE bytes + 64 bfloat16 RoPE values + 8 scale bytes (vLLM fixes it for 512/64)."""
PAGE_ALIGNMENT: Final = 576
CACHE_BLOCK: Final = 256
SWA_BLOCK: Final = 64
STATE_BLOCK: Final = {4: 4, 128: 8}
INDEX_SCALE_TILE: Final = 128
"""One float32 scale (4 bytes) per 128 fp8 indexer values."""


def build_deepseek_v4_request(arch: RegularArchitecture, settings: Settings) -> PlanRequest:
    _refuse_unplannable(arch, settings)
    latent = {"head_size": HEAD_DIM, "dtype": "uint8", "state_content_bytes": ROW_BYTES,
              "cache_dtype": KV_DTYPE, "alignment": PAGE_ALIGNMENT,
              "model_version": "deepseek_v4"}
    window = {"kind": "sliding_window_mla", "block_size": SWA_BLOCK,
              "sliding_window": arch.sliding_window, **latent}
    decoder_layers: list[dict[str, dict[str, Any]]] = []
    for i, ratio in enumerate(arch.compress_ratios_per_layer()):
        prefix = LAYER.format(i)
        caches: dict[str, dict[str, Any]] = {}
        if ratio == 4:
            caches[f"{prefix}.indexer.k_cache"] = _index_keys(arch.index_head_dim or 0)
            caches[f"{prefix}.indexer.compressor.state_cache"] = _state(
                arch.index_head_dim or 0, ratio)
        caches[f"{prefix}.swa_cache"] = window
        if ratio > 1:
            caches[prefix] = {"kind": "mla", "block_size": CACHE_BLOCK, "compress_ratio": ratio,
                              **latent}
            caches[f"{prefix}.compressor.state_cache"] = _state(HEAD_DIM, ratio)
        decoder_layers.append(caches)
    max_model_len = context_length(arch.max_position_embeddings, settings)
    return regular_plan_request(decoder_layers, max_model_len, settings)


def _index_keys(index_head_dim: int) -> dict[str, Any]:
    row = index_head_dim + index_head_dim // INDEX_SCALE_TILE * 4
    return {"kind": "mla", "block_size": CACHE_BLOCK, "head_size": row, "dtype": "uint8",
            "compress_ratio": 4, "alignment": PAGE_ALIGNMENT}


def _state(dim: int, ratio: int) -> dict[str, Any]:
    overlap = 2 if ratio == 4 else 1
    return {"kind": "sliding_window_mla", "block_size": STATE_BLOCK[ratio],
            "head_size": 2 * overlap * dim, "dtype": "float32",
            "sliding_window": overlap * ratio, "alignment": PAGE_ALIGNMENT}


def _refuse_unplannable(arch: RegularArchitecture, settings: Settings) -> None:
    refuse_unplannable(settings, (KV_DTYPE,), "vLLM 0.33's FlashMLA sparse DeepSeek-V4 cache")
    if settings.block_size not in (None, CACHE_BLOCK):
        raise ConfigError(
            f"block_size: DeepSeek-V4's compressed caches use vLLM's {CACHE_BLOCK}-token blocks "
            f"(its sliding-window and compressor caches fix their own); got {settings.block_size}",
            field="block_size",
        )
    if (arch.head_dim, arch.qk_rope_head_dim) != (HEAD_DIM, ROPE_DIM):
        raise ConfigError(
            f"head_dim: vLLM 0.33's DeepSeek-V4 fp8_ds_mla row is {ROW_BYTES} bytes for head_dim "
            f"{HEAD_DIM} with qk_rope_head_dim {ROPE_DIM}; got {arch.head_dim} and "
            f"{arch.qk_rope_head_dim}",
            field="head_dim",
        )
    index_dim = arch.index_head_dim
    if index_dim is not None and index_dim % INDEX_SCALE_TILE:
        raise ConfigError(
            f"index_head_dim: expected a multiple of {INDEX_SCALE_TILE} (one fp8 scale per "
            f"{INDEX_SCALE_TILE} values), got {index_dim}",
            field="index_head_dim",
        )
    tp = settings.tp or 1
    if arch.attention_heads % tp:
        raise ConfigError(
            f"tp: num_attention_heads ({arch.attention_heads}) must be a multiple of the "
            f"tensor-parallel ranks ({tp}); every rank keeps the same caches",
            field="tp",
        )
