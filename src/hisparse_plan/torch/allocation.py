"""What `allocate` is asked, for either engine's plan: its keywords as given (`Arguments`, with
their defaults), and checked once, before any memory is touched (`Arguments.checked`).

Each engine's part of the backend allocates its own plans, and starts the same way: it refuses
a plan `check_plan` refuses (`check_sound`), then checks these arguments; the rest is its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypedDict

import torch

from hisparse_plan.checking import check_plan
from hisparse_plan.errors import PlanInvariantError
from hisparse_plan.models.any_plan import Plan
from hisparse_plan.torch.devices import check_pin, parse_device, pin_device_index
from hisparse_plan.torch.errors import BackendError, UnsoundPlanError
from hisparse_plan.torch.hostmem.chunks import CHUNK_BYTES, Chunk, Train, plan_chunks
from hisparse_plan.torch.hostmem.lifecycle import HostOptions
from hisparse_plan.torch.hostmem.locks import DEFAULT_LOCK_TIMEOUT_S
from hisparse_plan.torch.hostmem.mapping import OS_PAGE, default_prefault_threads
from hisparse_plan.torch.hostmem.registration import CudaRegistrar, Registrar
from hisparse_plan.torch.hostmem.tasks import Progress


class AllocateOptions(TypedDict, total=False):
    """`allocate`'s keywords (each documented there, its default in `Arguments`)."""

    device: str
    pin: bool
    register_chunk_bytes: int
    prefault_threads: int | None
    huge_pages: bool
    registrar: Registrar | None
    host_pool_name: str | None
    numa_node: int | None
    progress: Progress | None
    stage: int | None
    lock_timeout_s: float


@dataclass(frozen=True, slots=True)
class Arguments:
    """`allocate`'s keywords as given, and their defaults."""

    device: str = "cuda"
    pin: bool = True
    register_chunk_bytes: int = CHUNK_BYTES
    prefault_threads: int | None = None
    """None: up to 8 threads (`default_prefault_threads`)."""
    huge_pages: bool = True
    registrar: Registrar | None = None
    host_pool_name: str | None = None
    numa_node: int | None = None
    progress: Progress | None = None
    stage: int | None = None
    lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S

    def checked(self) -> Allocation:
        """What `allocate` refuses, after an unsound plan, before anything else: an unknown
        device, pinning without CUDA, a negative thread count or NUMA node."""
        device = parse_device(self.device)
        check_pin(self.pin, device, own_registrar=self.registrar is not None)
        threads = (default_prefault_threads() if self.prefault_threads is None
                   else self.prefault_threads)
        if threads < 0:
            raise BackendError(f"prefault_threads is {threads}; expected 0 (no prefault) or more")
        if self.numa_node is not None and self.numa_node < 0:
            raise BackendError(f"numa_node is {self.numa_node}; expected None (follow the GPU) "
                               "or a node number, 0 or more")
        gpu = device.index if device.type == "cuda" else None
        host = HostOptions(self.huge_pages, self.numa_node, gpu, threads, self.progress,
                           self.lock_timeout_s)
        return Allocation(device, self.pin, host, self.register_chunk_bytes, self.registrar,
                          self.host_pool_name, self.stage)


@dataclass(frozen=True, slots=True)
class Allocation:
    """`allocate`'s arguments, checked: the device parsed, and the host pools' options (the
    prefault threads decided, the GPU whose NUMA node they follow) as `hostmem` takes them."""

    device: torch.device
    pin: bool
    host: HostOptions
    register_chunk_bytes: int
    registrar: Registrar | None
    host_pool_name: str | None
    stage: int | None

    def chunks(self, nbytes: int, trains: Sequence[Train]) -> list[Chunk]:
        """The registration chunks of a host pool of `nbytes` whose pages run as `trains`."""
        return plan_chunks(nbytes, trains, chunk_bytes=self.register_chunk_bytes,
                           os_page=OS_PAGE)

    def pinning(self) -> Registrar:
        """What registers the host pools: the caller's registrar, else CUDA, from the device
        pools' GPU (or the current one)."""
        return self.registrar or CudaRegistrar(pin_device_index(self.device))


def check_sound(plan: Plan) -> None:
    """Refuse a plan `check_plan` refuses (layer_stride 0 loaded from JSON, say): its views
    could overlap across block ids, and only `verify` would notice, after the fact."""
    try:
        check_plan(plan)
    except PlanInvariantError as error:
        raise UnsoundPlanError(
            f"allocate refuses a plan that check_plan does not prove sound: {error}",
            tensor=error.tensor, layer=error.layer, block=error.block,
        ) from error
