"""Host memory for a pool of a given number of bytes, from the RAM it may take to its release.
Knows no plan: imports nothing of the package but itself and `torch/errors.py`.

Nothing in this package knows a plan: it takes sizes, the runs of bytes a registration chunk
must not cut, a NUMA node, a shared pool's name. Its life, in the order it runs (module
`lifecycle` holds the steps and tells it at length):

1. fit      `ram`           the RAM the pool may take (MemAvailable, every cgroup above)
2. map      `mapping`       one page-aligned mapping of exactly its bytes (`HostBuffer`)
3. place    `numa`          bound to the NUMA node of the GPU it serves, before a page exists
4. prefault `mapping`       every page committed now, on threads (`tasks`)
5. share    `shm`           one /dev/shm file every rank maps (`shmfiles`: trusted files only;
                            `locks`: waits with a deadline)
6. register `chunks`, `registration`  pinned with CUDA in chunks no page crosses, all or nothing
7. release  `state`         unregister, then unmap, then let go of a shared pool
"""

from hisparse_plan.torch.hostmem.chunks import CHUNK_BYTES, Chunk, plan_chunks
from hisparse_plan.torch.hostmem.lifecycle import HostOptions, private, register, share
from hisparse_plan.torch.hostmem.mapping import OS_PAGE, HostBuffer, MetaHostBuffer
from hisparse_plan.torch.hostmem.numa import NumaPlacement
from hisparse_plan.torch.hostmem.ram import (
    DEVICE_POOL_ADVICE,
    HOST_POOL_ADVICE,
    HOST_RAM_FRACTION,
    HostMemory,
    available_host_memory,
    check_host_fits,
    gib,
)
from hisparse_plan.torch.hostmem.registration import CudaRegistrar, Registrar, Registration
from hisparse_plan.torch.hostmem.shm import SharedPool
from hisparse_plan.torch.hostmem.state import HostState, close_all
from hisparse_plan.torch.hostmem.tasks import Progress

__all__ = [
    "CHUNK_BYTES",
    "DEVICE_POOL_ADVICE",
    "HOST_POOL_ADVICE",
    "HOST_RAM_FRACTION",
    "OS_PAGE",
    "Chunk",
    "CudaRegistrar",
    "HostBuffer",
    "HostMemory",
    "HostOptions",
    "HostState",
    "MetaHostBuffer",
    "NumaPlacement",
    "Progress",
    "Registrar",
    "Registration",
    "SharedPool",
    "available_host_memory",
    "check_host_fits",
    "close_all",
    "gib",
    "plan_chunks",
    "private",
    "register",
    "share",
]
