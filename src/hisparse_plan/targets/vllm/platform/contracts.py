"""The stride rules the kernels that read a cache by stride hold a plan to, as data, applied
to every plan: a plan a kernel would misread or assert against is refused, naming the kernel
and both numbers, even where vLLM 0.34 itself accepts the layout (vllm#55431: a block-outermost
layout gives a latent block stride that is no whole number of 656-byte rows, and
`MLAAttention.bind_kv_cache` asserts; vLLM's fix is unreleased)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from hisparse_plan.errors import UnsupportedRequestError
from hisparse_plan.models import KVCachePlan, PlanRequest
from hisparse_plan.models.dtypes import dtype_size
from hisparse_plan.models.layer_specs import LatentLayerSpec, LayerSpec, MLASpec

FLAT_ROW_BACKENDS: Final = frozenset({
    "FLASHINFER_MLA_SPARSE", "FLASH_ATTN_MLA_SPARSE", "FLASH_ATTN_MLA_SPARSE_FA4",
    "FLASHINFER_MLA_SPARSE_SM90", "FLASHINFER_MLA_SPARSE_SM120",
})
"""Sparse-MLA backends that view the latent cache as flat rows (`flat_kv_row_view` in
vllm/v1/attention/backends/mla/sparse_utils.py) whatever its dtype and block size."""
PAGED_DS_MLA: Final = frozenset({"fp8_ds_mla", "nvfp4_ds_mla"})
FP8_PAGE_TOKENS: Final = 64
"""FlashMLA sparse reads an fp8_ds_mla cache as 64-token pages, flat only when a block spans
several (mla/flashmla_sparse.py `_fp8_kv_pages`)."""
INDEXER_PAGE_ALIGN: Final = 256
DEEP_GEMM_MAJORS: Final = frozenset({9, 10})
"""Compute capabilities whose indexer scores paged keys with DeepGEMM's kernels (vLLM's
`support_deep_gemm`: 9.0 and the 10.x family; 12.x's DeepGEMM path is not assumed here)."""


@dataclass(frozen=True, slots=True)
class StrideContract:
    """One kernel's rule: `block_stride % divisor == 0` for the layers it reads."""

    kernel: str
    file: str
    role: str
    """"sparse" (the latent rows) or "indexer" (the indexer keys): the layer's cache_role."""
    divisor: str
    """"row" (the layer's row bytes) or a byte count."""


LATENT_ROWS: Final = StrideContract(
    "flat_kv_row_view (MLAAttention.bind_kv_cache asserts kv_cache.stride(0) % row_width == 0)",
    "vllm/v1/attention/backends/mla/sparse_utils.py, "
    "vllm/model_executor/layers/attention/mla_attention.py", "sparse", "row")
INDEXER_PAGES: Final = StrideContract(
    "sparse_mqa_logits_paged_decode (asserts kv_cache.stride(0) % 256 == 0)",
    "vllm/model_executor/kernels/attention/dsa/sparse_mqa_logits.py", "indexer",
    str(INDEXER_PAGE_ALIGN))


@dataclass(frozen=True, slots=True)
class StrideViolation:
    contract: StrideContract
    layer: str
    block_stride: int
    divisor: int

    @property
    def message(self) -> str:
        return (f"{self.layer}: block stride {self.block_stride} bytes is not a multiple of "
                f"{self.divisor} bytes, which {self.contract.kernel} needs ({self.contract.file}); "
                "choose a layout whose block stride is a whole number of rows (e.g. the one "
                "vLLM resolves for this GPU, see docs/planning-rules.md#backends-and-layout)")


def stride_contracts(request: PlanRequest, backends: Mapping[str, str] | None,
                     capability: tuple[int, int] | None = None) -> tuple[StrideContract, ...]:
    """The contracts the request's kernels hold. With the GPU known (`backends`, a layer
    kind's backend by kind, and its `capability`): the selected sparse backend's latent row
    rule, and on 9.x and 10.x (DeepGEMM's paged logits kernel) the indexer's 256-byte rule.
    Without (a request alone): the rules every GPU's backends share, the latent row rule where
    every sparse backend reads flat rows (a dtype other than fp8_ds_mla, or blocks spanning
    several 64-token pages)."""
    specs = list(request.layers.values())
    if not any(isinstance(spec, MLASpec) and spec.cache_role == "indexer" for spec in specs):
        return ()
    contracts = []
    if backends is not None and capability is not None and capability[0] in DEEP_GEMM_MAJORS:
        contracts.append(INDEXER_PAGES)
    latent = [spec for spec in specs if isinstance(spec, MLASpec) and spec.cache_role == "sparse"]
    if latent and _reads_flat(latent[0], backends):
        contracts.append(LATENT_ROWS)
    return tuple(contracts)


def _reads_flat(spec: MLASpec, backends: Mapping[str, str] | None) -> bool:
    paged = spec.cache_dtype in PAGED_DS_MLA and spec.block_size == FP8_PAGE_TOKENS
    if backends is None:
        return not paged
    backend = backends.get("sparse_mla")
    if backend in FLAT_ROW_BACKENDS:
        return True
    return backend == "FLASHMLA_SPARSE" and not paged


def _row_bytes(spec: LayerSpec) -> int:
    if isinstance(spec, LatentLayerSpec) and spec.state_content_bytes:
        return spec.state_content_bytes
    return getattr(spec, "head_size", 1) * dtype_size(getattr(spec, "dtype", "uint8"))


def check_stride_contracts(plan: KVCachePlan, request: PlanRequest,
                           contracts: tuple[StrideContract, ...]) -> None:
    """Refuse `plan` at the first GPU tensor a contract's kernel would misread."""
    for contract in contracts:
        for tensor in plan.tensors:
            if tensor.host_resident:
                continue
            for name in tensor.layers:
                spec = request.layers.get(name)
                if not isinstance(spec, MLASpec) or spec.cache_role != contract.role:
                    continue
                divisor = (_row_bytes(spec) if contract.divisor == "row"
                           else int(contract.divisor))
                if tensor.block_stride % divisor:
                    raise UnsupportedRequestError(StrideViolation(
                        contract, name, tensor.block_stride, divisor).message)
