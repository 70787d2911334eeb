"""The host pool's memory: the RAM it may take, its mapping, NUMA placement, prefault, CUDA
registration in chunks, sharing across ranks, and release.

Until this package's story is written out, its modules hold the steps; `hisparse_plan.torch
.hostmem` was the module now at `hostmem.ram`, whose names still import from here.
"""

from hisparse_plan.torch.hostmem.ram import (
    DEVICE_POOL_ADVICE,
    HOST_POOL_ADVICE,
    HOST_RAM_FRACTION,
    HostMemory,
    available_host_memory,
    check_host_fits,
    gib,
)

__all__ = [
    "DEVICE_POOL_ADVICE",
    "HOST_POOL_ADVICE",
    "HOST_RAM_FRACTION",
    "HostMemory",
    "available_host_memory",
    "check_host_fits",
    "gib",
]
