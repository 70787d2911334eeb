"""The torch backend: allocate a plan's pools, bind its layer views, verify them on real bytes.
The one importer of torch; may import models, rules, views, checking and exchange.

This subpackage is the only place `hisparse_plan` imports torch (the `torch` extra). `allocate`,
`verify` and `meta_check` (`engines.py`) hand a plan to its engine's part, `vllm/` or `sglang/`;
both keep their host pools with `hostmem/`, which knows no plan (docs/architecture.md, "The
torch backend").
"""

from __future__ import annotations

try:
    import torch as _torch  # noqa: F401 - fail here, with the fix, rather than deep inside
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError(
        "hisparse_plan.torch needs PyTorch; install the extra: pip install 'hisparse-plan[torch]'"
    ) from error

from hisparse_plan.torch.devices import default_device
from hisparse_plan.torch.engines import (
    TORCH_DTYPES,
    MetaReport,
    Pools,
    SGLangMetaReport,
    SGLangPools,
    allocate,
    bind_view,
    bind_views,
    check_bound,
    host_pool_bytes,
    host_trains,
    meta_check,
    transfer_regions,
    verify,
)
from hisparse_plan.torch.errors import (
    BackendError,
    HostMemoryError,
    RegistrationError,
    UnsoundPlanError,
    VerifyError,
)
from hisparse_plan.torch.hostmem.chunks import CHUNK_BYTES, Chunk, plan_chunks
from hisparse_plan.torch.hostmem.numa import NumaPlacement
from hisparse_plan.torch.hostmem.ram import HostMemory, available_host_memory
from hisparse_plan.torch.hostmem.registration import CudaRegistrar, Registrar, Registration
from hisparse_plan.torch.hostmem.shm import SharedPool
from hisparse_plan.torch.hostmem.tasks import Progress
from hisparse_plan.torch.verifying import VerifyReport

__all__ = [
    "CHUNK_BYTES",
    "TORCH_DTYPES",
    "BackendError",
    "Chunk",
    "CudaRegistrar",
    "HostMemory",
    "HostMemoryError",
    "MetaReport",
    "NumaPlacement",
    "Pools",
    "Progress",
    "Registrar",
    "Registration",
    "RegistrationError",
    "SGLangMetaReport",
    "SGLangPools",
    "SharedPool",
    "UnsoundPlanError",
    "VerifyError",
    "VerifyReport",
    "allocate",
    "available_host_memory",
    "bind_view",
    "bind_views",
    "check_bound",
    "default_device",
    "host_pool_bytes",
    "host_trains",
    "meta_check",
    "plan_chunks",
    "transfer_regions",
    "verify",
]
