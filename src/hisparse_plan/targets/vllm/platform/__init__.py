"""vLLM 0.34 on a given CUDA GPU: the attention backend each layer kind gets
(`selection.py`, over `priorities.py` and `backends.py`), the KV-cache layout those backends
resolve to (`layout.py`), and the stride rules their kernels hold a plan to (`contracts.py`).
See docs/planning-rules.md#backends-and-layout."""

from hisparse_plan.targets.vllm.platform.contracts import (
    StrideContract,
    StrideViolation,
    check_stride_contracts,
    stride_contracts,
)
from hisparse_plan.targets.vllm.platform.layout import LayoutResolution, resolve_layout
from hisparse_plan.targets.vllm.platform.selection import (
    AttentionLayer,
    Platform,
    Resolution,
    layers_of,
    resolve_platform,
    select_backend,
)

__all__ = [
    "AttentionLayer",
    "LayoutResolution",
    "Platform",
    "Resolution",
    "StrideContract",
    "StrideViolation",
    "check_stride_contracts",
    "layers_of",
    "resolve_layout",
    "resolve_platform",
    "select_backend",
    "stride_contracts",
]
