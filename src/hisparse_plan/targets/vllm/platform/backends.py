"""The CUDA attention backends vLLM 0.34 may select for a decoder layer, as data: where each
runs and what it refuses (each class's `validate_configuration` checks), and the KV-cache
layouts it declares (`supported_kv_cache_layouts`). Files are under vllm/v1/attention/backends/
unless named otherwise."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from hisparse_plan.targets.vllm.platform.priorities import QUANTIZED_KV, Capability

LayoutSet = tuple[str, ...]
DEFAULT_PREFERENCE: Final[LayoutSet] = ("LBNHC", "LBHNC", "BLNHC", "BLHNC", "BHLNC", "LHBNC")
"""`_DEFAULT_LAYOUT_PREFERENCE` (utils.py): the order where no backend declares a set."""
FLASHINFER_LAYOUTS: Final[LayoutSet] = ("LBNHC", "LBHNC", "BLNHC", "BLHNC", "BHLNC")
"""`get_flashinfer_kv_cache_layouts` (utils.py): the default order less LHBNC, which
FlashInfer cannot address as NHD or HND pages."""
BF16: Final = frozenset({"auto", "bfloat16", "float16"})
FP8: Final = frozenset({"fp8", "fp8_e4m3"})


@dataclass(frozen=True, slots=True)
class Query:
    """What a layer hands vLLM's selector (`AttentionSelectorConfig`)."""

    head_size: int
    kv_dtype: str
    mla: bool = False
    sparse: bool = False
    sink: bool = False
    num_heads: int | None = None


@dataclass(frozen=True, slots=True)
class Backend:
    name: str
    file: str
    mla: bool
    sparse: bool
    runs_on: Callable[[Capability], bool]
    kv_dtypes: frozenset[str]
    head_sizes: Callable[[int], bool] = lambda size: True
    sinks: Callable[[Capability], bool] = lambda capability: False
    flashinfer: bool = False
    """Needs FlashInfer's kernels (the flashinfer-python package) to import."""
    refuses: Callable[[Query, Capability], str | None] = lambda query, capability: None
    layouts: Callable[[Capability], LayoutSet | None] = lambda capability: None


def flash_attn_version(capability: Capability) -> int:
    """FlashAttention's version on a GPU (fa_utils.py `get_flash_attn_version`): FA3 on 9.x,
    FA4 on 10.x, FA2 elsewhere."""
    return {9: 3, 10: 4}.get(capability[0], 2)


def _flash_attn_refuses(query: Query, capability: Capability) -> str | None:
    """flash_attn.py `supports_combination`: sinks need 9.0 and FA3/FA4; a quantized KV cache
    needs FA3 on 9.x or FA4 on 10.x (fa_utils.py `flash_attn_supports_kv_cache_dtype`)."""
    version = flash_attn_version(capability)
    if query.sink and (capability < (9, 0) or version not in (3, 4)):
        return "sink not supported"
    if query.kv_dtype in QUANTIZED_KV and version not in (3, 4):
        return "FP8 KV requires FA3 (SM90) or FA4 (SM100)"
    return None


def _flashinfer_sinks(capability: Capability) -> bool:
    """flashinfer.py `supports_sink`: TRTLLM kernels on 9.0, 10.x and 12.x (cubins present)."""
    return capability == (9, 0) or capability[0] in (10, 12)


def _flashinfer_layouts(capability: Capability) -> LayoutSet:
    """flashinfer.py `supported_kv_cache_layouts`: trtllm-gen on 10.x reads head-major blocks."""
    return ("LBHNC", "BLHNC") if capability[0] == 10 else FLASHINFER_LAYOUTS


def _flashinfer_sparse_refuses(query: Query, capability: Capability) -> str | None:
    """mla/flashinfer_mla_sparse.py: fp8_ds_mla is not an SM10 FlashInfer sparse dtype."""
    return "fp8_ds_mla on SM10" if query.kv_dtype == "fp8_ds_mla" else None


def _sm90_sparse_refuses(query: Query, capability: Capability) -> str | None:
    """mla/flashinfer_mla_sparse_sm90.py checks FlashInfer's SM90 MLA entry point
    (`ckv_scale_arr`), which this model does not assume present."""
    return "FlashInfer SM90 MLA support not assumed"


def _never(reason: str) -> Callable[[Query, Capability], str | None]:
    return lambda query, capability: reason


BACKENDS: Final[dict[str, Backend]] = {backend.name: backend for backend in (
    Backend("FLASH_ATTN", "flash_attn.py", False, False, lambda c: c >= (8, 0),
            BF16 | FP8, lambda h: h % 8 == 0 and h <= 256, lambda c: c >= (9, 0),
            refuses=_flash_attn_refuses),
    Backend("FLASHINFER", "flashinfer.py", False, False, lambda c: (8, 0) <= c <= (12, 1),
            BF16 | FP8 | {"fp8_e5m2"}, lambda h: h in (64, 128, 256, 512), _flashinfer_sinks,
            flashinfer=True, layouts=_flashinfer_layouts),
    Backend("TRITON_ATTN", "triton_attn.py", False, False, lambda c: True,
            BF16 | FP8 | {"fp8_e5m2"}, lambda h: h >= 32, lambda c: True),
    Backend("FLEX_ATTENTION", "flex_attention.py", False, False, lambda c: True, BF16,
            layouts=lambda c: ("LBNHC",)),
    Backend("TURBOQUANT", "turboquant_attn.py", False, False, lambda c: True, frozenset(),
            layouts=lambda c: ("LBNHC",)),
    Backend("FLASH_ATTN_MLA", "mla/flashattn_mla.py", True, False, lambda c: c[0] == 9, BF16),
    Backend("FLASHMLA", "mla/flashmla.py", True, False, lambda c: c[0] in (9, 10), BF16 | FP8),
    Backend("FLASHINFER_MLA", "mla/flashinfer_mla.py", True, False, lambda c: c[0] == 10,
            BF16 | FP8, flashinfer=True),
    Backend("TOKENSPEED_MLA", "mla/tokenspeed_mla.py", True, False, lambda c: c[0] == 10, FP8,
            refuses=_never("the tokenspeed-mla package is not part of vLLM's wheel")),
    Backend("CUTLASS_MLA", "mla/cutlass_mla.py", True, False, lambda c: c[0] == 10,
            BF16 | FP8),
    Backend("TRITON_MLA", "mla/triton_mla.py", True, False, lambda c: True, BF16 | FP8),
    Backend("FLASH_ATTN_MLA_SPARSE", "mla/flashattn_mla_sparse.py", True, True,
            lambda c: c[0] == 9, BF16),
    Backend("FLASH_ATTN_MLA_SPARSE_FA4", "mla/flashattn_mla_sparse.py", True, True,
            lambda c: c[0] == 10, BF16),
    Backend("FLASHMLA_SPARSE", "mla/flashmla_sparse.py", True, True, lambda c: c[0] in (9, 10),
            BF16 | FP8 | {"fp8_ds_mla"}, lambda h: h in (576, 512)),
    Backend("FLASHINFER_MLA_SPARSE", "mla/flashinfer_mla_sparse.py", True, True,
            lambda c: c[0] == 10, BF16 | FP8 | {"fp8_ds_mla"}, flashinfer=True,
            refuses=_flashinfer_sparse_refuses),
    Backend("FLASHINFER_MLA_SPARSE_SM90", "mla/flashinfer_mla_sparse_sm90.py", True, True,
            lambda c: c[0] == 9, BF16 | FP8, flashinfer=True, refuses=_sm90_sparse_refuses),
    Backend("FLASHINFER_MLA_SPARSE_SM120", "mla/flashinfer_mla_sparse.py", True, True,
            lambda c: c[0] == 12, BF16 | FP8 | {"fp8_ds_mla"}, flashinfer=True),
)}

FIXED: Final[dict[str, tuple[str, LayoutSet | None]]] = {
    "DEEPSEEK_V32_INDEXER": ("mla/indexer.py", None),
    "DEEPSEEK_V4_INDEXER": ("mla/indexer.py", ("BLHNC", "BLNHC")),
    "FLASHMLA_SPARSE_DSV4": ("vllm/models/deepseek_v4/sparse_mla.py", None),
    "FLASHINFER_MLA_SPARSE_DSV4": ("vllm/models/deepseek_v4/nvidia/flashinfer_sparse.py", None),
    "DEEPSEEK_SPARSE_SWA": ("mla/sparse_swa.py", None),
    "CompressorBackend": ("vllm/models/deepseek_v4/compressor.py", None),
}
"""Backends a model's layer names itself rather than asking the selector: the indexers'
(`get_attn_backend` of the indexer caches), DeepSeek-V4's attention classes. Each with its
file and its declared layouts (DeepSeek-V4's indexer packs its pages beside the latent pages
inside a block, so the layer axis must sit inside the block axis)."""


def refusals(backend: Backend, query: Query, capability: Capability,
             flashinfer: bool) -> list[str]:
    """What `validate_configuration` (vllm/v1/attention/backend.py) finds wrong, in its words;
    empty where the backend can serve the layer. Without FlashInfer a FlashInfer backend's
    import fails, which vLLM counts as invalid (platforms/cuda.py `get_valid_backends`)."""
    if backend.flashinfer and not flashinfer:
        return ["ImportError: flashinfer is not installed"]
    found = []
    if not backend.head_sizes(query.head_size):
        found.append("head_size not supported")
    if query.kv_dtype not in backend.kv_dtypes:
        found.append("kv_cache_dtype not supported")
    if query.mla != backend.mla:
        found.append("MLA not supported" if query.mla else "non-MLA not supported")
    if query.sink and not backend.sinks(capability):
        found.append("attention sinks not supported")
    if query.sparse != backend.sparse:
        found.append("sparse not supported" if query.sparse else "non-sparse not supported")
    if not backend.runs_on(capability):
        found.append("compute capability not supported")
    reason = backend.refuses(query, capability)
    if reason is not None:
        found.append(reason)
    return found


def declared_layouts(name: str, capability: Capability) -> LayoutSet | None:
    """The layouts backend `name` declares, most preferred first, or None (any layout)."""
    if name in BACKENDS:
        return BACKENDS[name].layouts(capability)
    return FIXED[name][1]


def backend_file(name: str) -> str:
    return BACKENDS[name].file if name in BACKENDS else FIXED[name][0]
