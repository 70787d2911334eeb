"""SGLang's server defaults, one function each, the resolve stage's (resolve.py): the page
size, each pool's element type, the latent row's width, mem_fraction_static (memory_rule.py's
rule when none is given), the window pool's ratio, the Mamba states' dtypes, and HiSparse's hot
buffer; and the settings a model refuses (HiSparse without DSA)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from hisparse_plan.errors import PlanError, UnsupportedRequestError
from hisparse_plan.models.sglang_settings import SGLangSettings
from hisparse_plan.targets.sglang.memory_rule import default_mem_fraction_static
from hisparse_plan.targets.sglang.model import LatentGroup, SGLangModel
from hisparse_plan.targets.sglang.platform import (
    blackwell_page,
    dsa_backends,
    dsa_kv_cache_dtype,
    raw_latent_row,
)
from hisparse_plan.targets.sglang.sizing import element_size

MAMBA_CONV_DTYPE: Final = "bfloat16"
"""SGLang's conv-state dtype unless its environment says otherwise."""
MAMBA_SSM_DTYPE: Final = "float32"
"""SGLang's temporal-state dtype unless the model config or settings say otherwise."""
DSA_PAGE_SIZE: Final = 64
"""DSA models page their index keys by 64 tokens; SGLang sets that page on CUDA."""
DEFAULT_SWA_FULL_TOKENS_RATIO: Final = 0.8
_KV_DTYPE_SETTING: Final[dict[str, str]] = {
    "bfloat16": "bfloat16", "float16": "float16",
    "fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2",
}
_LAYER_DTYPE: Final[dict[str, str]] = {
    "bfloat16": "bfloat16", "float16": "float16", "float32": "float32",
    "float8_e4m3fn": "float8_e4m3fn", "float8_e5m2": "float8_e5m2",
    "uint8": "float8_e4m3fn", "int8": "float8_e4m3fn",
}
_FP8: Final = frozenset({"float8_e4m3fn", "float8_e5m2"})


def default_page_size(settings: SGLangSettings, model: SGLangModel) -> int:
    """Tokens per page: a DSA model's 64 whatever was given (dsa_page_size), else
    `--page-size` when given, else 1; then the page Blackwell's default trtllm attention
    backends force (blackwell_page). A backend given by hand that forces a page (flashmla's 64
    for MLA) must be given as page_size."""
    if model.latent is not None and model.latent.is_dsa:
        return dsa_page_size(settings)
    page = 1 if settings.page_size is None else settings.page_size
    return blackwell_page(settings, model, page)


def dsa_page_size(settings: SGLangSettings) -> int:
    """A DSA model's page on a CUDA GPU: SGLang's `_deepseek_family_overrides`
    (arg_groups/model_overrides/deepseek_v2.py) sets page_size to 64 x index_kpool (1 on the
    configs planned) whatever `--page-size` says, logging "Setting page size to 64 for
    DeepSeek DSA"; a page given otherwise is rewritten, not refused (the trace says so)."""
    del settings  # the override does not read the given page
    return DSA_PAGE_SIZE


def kv_dtype(settings: SGLangSettings, layer_dtype: str) -> str:
    """The cache's element type: `auto` keeps the layer's own dtype (a uint8 layer is an fp8
    cache stored as bytes), any other `--kv-cache-dtype` replaces it."""
    if settings.kv_cache_dtype != "auto":
        return _KV_DTYPE_SETTING[settings.kv_cache_dtype]
    return _LAYER_DTYPE[layer_dtype]


def store_dtype(dtype: str) -> str:
    """What the buffers hold: SGLang stores fp8 caches as uint8 (it cannot index_put fp8)."""
    return "uint8" if dtype in _FP8 else dtype


def latent_row_elements(settings: SGLangSettings, latent: LatentGroup, dtype: str) -> int:
    """Elements of one latent row (SGLang's kv_cache_dim). Plain MLA and DSA with the trtllm or
    tilelang backend keep the raw kv_lora_rank + rope row (576); DSA with an fp8-e4m3 cache and
    any other backend (flashmla_kv by default) packs fp8 nope bytes, one fp32 scale per 128 and
    a bf16 rope part: kv_lora_rank + kv_lora_rank / 128 * 4 + 2 * 64 bytes (656)."""
    raw = latent.latent_dim
    if not latent.is_dsa or dtype != "float8_e4m3fn":
        return raw
    if raw_latent_row(dsa_backends(settings, "fp8_e4m3")):
        return raw
    rank = latent.kv_lora_rank
    return rank + rank // 128 * 4 + (raw - rank) * 2


def swa_full_tokens_ratio(settings: SGLangSettings) -> float:
    """Window-pool tokens per full-pool token: `--swa-full-tokens-ratio`, else 0.8."""
    ratio = settings.swa_full_tokens_ratio
    return DEFAULT_SWA_FULL_TOKENS_RATIO if ratio is None else ratio


def static_fraction(settings: SGLangSettings, model: SGLangModel) -> float | None:
    """The mem_fraction_static SGLang runs with: `--mem-fraction-static` when given, else its
    default rule when the GPU's total memory (gpu_memory_bytes) is known (MLA models keep more
    back for prefill graphs), else unknown (null)."""
    if settings.mem_fraction_static is not None:
        return settings.mem_fraction_static
    if settings.gpu_memory_bytes is None:
        return None
    return default_mem_fraction_static(settings, mla=model.latent is not None)


def hisparse_device_buffer(settings: SGLangSettings, top_k: int | None = None) -> int:
    """Hot rows per request (hisparse_buffer_size), refused below the top-k the coordinator
    runs (refuse_hot_buffer_below_top_k)."""
    size = hisparse_buffer_size(settings)
    refuse_hot_buffer_below_top_k(settings, size, top_k)
    return size


def hisparse_buffer_size(settings: SGLangSettings) -> int:
    """Hot rows per request: the given size, else 2 * hisparse_config's top_k."""
    size = settings.hisparse_device_buffer_size
    return 2 * settings.hisparse_top_k if size is None else size


def refuse_hot_buffer_below_top_k(settings: SGLangSettings, size: int,
                                  top_k: int | None = None) -> None:
    """A hot buffer of fewer rows than the top-k the coordinator runs (`top_k`, the model's
    index_topk; else the config's) is refused. SGLang builds that plan (its config check
    compares the buffer with the config's top_k only), but cannot run it: every decode step's
    swap-in asserts hot_buffer_size >= num_top_k (kernels/ops/kvcache/hisparse.py:301, called
    by HiSparseCoordinator._run_swap_in_kernel with the index_topk), and past the assert the
    kernel would index its LRU slots below zero (hisparse.cuh:651).
    docs/planning-rules.md#sglang-model-and-gpu."""
    runs = settings.hisparse_top_k if top_k is None else top_k
    if size < runs:
        raise PlanError(
            f"engine.hisparse_device_buffer_size: the hot buffer must hold the {runs} rows "
            f"the indexer selects (the model's index_topk, else hisparse top_k): SGLang's "
            f"decode swap-in asserts hot_buffer_size >= num_top_k; expected at least {runs}, "
            f"got {size} (see docs/planning-rules.md#sglang-model-and-gpu)",
            field="engine.hisparse_device_buffer_size",
        )


def hisparse_top_k(settings: SGLangSettings, index_topk: int | None) -> int:
    """The top-k HiSparse's coordinator runs: the model's index_topk (model_runner reads
    hf_text_config.index_topk), else `--hisparse-config`'s top_k, which otherwise only sets the
    default device buffer."""
    return settings.hisparse_top_k if index_topk is None else index_topk


@dataclass(frozen=True)
class CacheDtype:
    """A pool's element type: what the cache holds, and what its buffers are made of."""

    cache: str
    store: str


def cache_dtype(settings: SGLangSettings, layer_dtype: str) -> CacheDtype:
    """The pool's element type for layers of `layer_dtype` (kv_dtype), stored as store_dtype."""
    dtype = kv_dtype(settings, layer_dtype)
    return CacheDtype(dtype, store_dtype(dtype))


@dataclass(frozen=True)
class LatentRow:
    """One token's row of the latent pool."""

    elements: int
    nbytes: int
    dtype: CacheDtype


def latent_row(settings: SGLangSettings, latent: LatentGroup) -> LatentRow:
    """The latent pool's row: latent_row_elements of the pool's element type, in stored bytes.
    A DSA model under `auto` on Blackwell caches fp8 (dsa_kv_cache_dtype)."""
    if latent.is_dsa and settings.kv_cache_dtype == "auto":
        resolved = dsa_kv_cache_dtype(settings, SGLangModel(None, None, latent, None))
        if resolved == "fp8_e4m3":
            settings = settings.model_copy(update={"kv_cache_dtype": resolved})
    dtype = cache_dtype(settings, latent.dtype)
    row = latent_row_elements(settings, latent, dtype.cache)
    return LatentRow(row, row * element_size(dtype.store), dtype)


def ssm_dtype(settings: SGLangSettings) -> str:
    """The temporal state's dtype: `--mamba-ssm-dtype`, else float32."""
    return MAMBA_SSM_DTYPE if settings.mamba_ssm_dtype is None else settings.mamba_ssm_dtype


def refuse_hisparse_without_dsa(settings: SGLangSettings, model: SGLangModel) -> None:
    """SGLang's HiSparse pools here are the DSA ones (HiSparseDSATokenToKVPool)."""
    if settings.enable_hisparse and (model.latent is None or not model.latent.is_dsa):
        raise UnsupportedRequestError(
            "engine.enable_hisparse: HiSparse is planned for SGLang's DSA models (mla layers "
            "with indexer layers); expected false for this model, got true",
            field="engine.enable_hisparse",
        )
