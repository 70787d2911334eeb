"""The order in which vLLM 0.34 tries attention backends on a CUDA GPU."""

from __future__ import annotations

from typing import Final

Capability = tuple[int, int]

QUANTIZED_KV: Final = frozenset({"fp8", "fp8_e4m3", "fp8_e5m2", "fp8_ds_mla", "nvfp4",
                                  "nvfp4_ds_mla"})
"""KV-cache dtypes `is_quantized_kv_cache` calls quantized (vllm/v1/kv_cache_interface.py)."""


def backend_priorities(
    use_mla: bool, capability: Capability, *, num_heads: int | None, kv_dtype: str,
    head_size: int,
) -> tuple[str, ...]:
    """Backends in the order vLLM tries them, for a causal decoder layer without multimodal
    prefix (vllm/platforms/cuda.py `_get_backend_priorities`)."""
    major = capability[0]
    if use_mla:
        if major == 10:
            if kv_dtype in QUANTIZED_KV:
                sparse: tuple[str, ...] = ("FLASHINFER_MLA_SPARSE", "FLASHMLA_SPARSE")
            elif num_heads is not None and num_heads <= 16:
                sparse = ("FLASH_ATTN_MLA_SPARSE_FA4", "FLASHINFER_MLA_SPARSE",
                          "FLASHMLA_SPARSE")
            else:
                sparse = ("FLASHMLA_SPARSE", "FLASHINFER_MLA_SPARSE")
            return ("FLASHINFER_MLA", "TOKENSPEED_MLA", "CUTLASS_MLA", "FLASH_ATTN_MLA",
                    "FLASHMLA", "TRITON_MLA", *sparse)
        if major == 12:
            return ("TRITON_MLA", "FLASHINFER_MLA_SPARSE_SM120")
        tail = ["FLASH_ATTN_MLA_SPARSE", "FLASHMLA_SPARSE"]
        if head_size == 512:
            tail.insert(0, "FLASHINFER_MLA_SPARSE_SM90")
        else:
            tail.append("FLASHINFER_MLA_SPARSE_SM90")
        return ("FLASH_ATTN_MLA", "FLASHMLA", "FLASHINFER_MLA", "TRITON_MLA", *tail)
    if major == 10:
        return ("FLASHINFER", "FLASH_ATTN", "TRITON_ATTN", "FLEX_ATTENTION", "TURBOQUANT")
    return ("FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "FLEX_ATTENTION", "TURBOQUANT")
