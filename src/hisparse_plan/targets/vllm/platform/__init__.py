"""vLLM 0.34 on a CUDA GPU: each layer kind's attention backend, the KV-cache layout they
resolve, and their kernels' stride rules. May import models, rules and the target's modules.

`selection.py` picks backends over `priorities.py` and `backends.py`; `layout.py` resolves the
layout; `contracts.py` holds a plan to the kernels' stride rules (see
docs/planning-rules.md#backends-and-layout).
"""

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
