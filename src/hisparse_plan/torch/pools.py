"""`allocate`: the host and device pools of a plan, exactly as planned, and their views."""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType

import torch

from hisparse_plan.models import KVCachePlan
from hisparse_plan.torch.binding import bind_views
from hisparse_plan.torch.chunks import CHUNK_BYTES, Chunk, host_trains, plan_chunks
from hisparse_plan.torch.devices import (
    allocate_device_pool,
    check_pin,
    parse_device,
    pin_device_index,
)
from hisparse_plan.torch.errors import BackendError, RegistrationError
from hisparse_plan.torch.host import (
    OS_PAGE,
    HostBuffer,
    MetaHostBuffer,
    default_prefault_threads,
)
from hisparse_plan.torch.hostmem import available_host_memory, check_host_fits
from hisparse_plan.torch.registration import (
    CudaRegistrar,
    Registrar,
    Registration,
    register_chunks,
)

_cuda_initialized: Callable[[], bool] = torch.cuda.is_initialized


@dataclass
class _HostState:
    """What must be undone for the host pool, in order: unregister, then free."""

    buffer: HostBuffer | MetaHostBuffer | None
    registration: Registration | None

    def close(self) -> None:
        if self.registration is not None:
            if torch.cuda.is_available() and _cuda_initialized():
                # A copy still reading the pool must finish before its pages unpin.
                torch.cuda.synchronize()
            registration, self.registration = self.registration, None
            try:
                registration.unregister()
            except RegistrationError:
                # Some pages may still be pinned for the GPU: drop the buffer without handing
                # its pages back, so nothing the driver can still reach is reused.
                self.buffer = None
                raise
        if self.buffer is not None:
            self.buffer.release()
            self.buffer = None


def _finalize(state: _HostState) -> None:
    # Garbage collection or interpreter exit: a failure here has no caller to tell.
    with contextlib.suppress(BackendError, RuntimeError):
        state.close()


class Pools:
    """The allocated pools of one plan. Use as a context manager, or call `release()`.

    `host` is the flat uint8 host pool (None when the plan has none), `device` the flat uint8
    device pool; both start at storage offset 0, so a view's storage offset is the plan's byte
    offset. Keep this object alive while the pools are in use pinned: releasing it (or letting
    it be collected) unpins the host pool and returns its pages.
    """

    def __init__(
        self,
        plan: KVCachePlan,
        host: HostBuffer | MetaHostBuffer | None,
        device: torch.Tensor,
        registration: Registration | None,
    ) -> None:
        self.plan = plan
        self._device: torch.Tensor | None = device
        self._state = _HostState(host, registration)
        self._chunks: tuple[Chunk, ...] = (
            () if registration is None else tuple(registration.chunks)
        )
        self._finalizer = weakref.finalize(self, _finalize, self._state)

    @property
    def released(self) -> bool:
        return self._device is None

    @property
    def host(self) -> torch.Tensor | None:
        self._check_live()
        buffer = self._state.buffer
        return None if buffer is None else buffer.tensor

    @property
    def device(self) -> torch.Tensor:
        if self._device is None:
            raise BackendError("the pools were released; allocate them again")
        return self._device

    @property
    def pinned(self) -> bool:
        """True when the host pool is registered with CUDA."""
        return not self.released and self._state.registration is not None

    @property
    def chunks(self) -> tuple[Chunk, ...]:
        """The host pool's registration chunks (empty when not pinned)."""
        return self._chunks if self.pinned else ()

    def views(self) -> dict[str, torch.Tensor]:
        """Every layer's tensor by name: [num_blocks, H, N, C] in the layer's dtype for
        attention layers, [num_blocks, page_bytes] uint8 for resident and hot layers."""
        return bind_views(self.plan, self.host, self.device)

    def release(self) -> None:
        """Unpin and free the host pool and drop the device pool. Idempotent."""
        if self.released:
            return
        self._device = None
        self._finalizer.detach()
        self._state.close()

    def _check_live(self) -> None:
        if self._device is None:
            raise BackendError("the pools were released; allocate them again")

    def __enter__(self) -> Pools:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.release()


def allocate(
    plan: KVCachePlan,
    *,
    device: str = "cuda",
    pin: bool = True,
    register_chunk_bytes: int = CHUNK_BYTES,
    prefault_threads: int | None = None,
    huge_pages: bool = True,
    registrar: Registrar | None = None,
) -> Pools:
    """Allocate the plan's pools: the host pool page-aligned and exactly sized, prefaulted on
    `prefault_threads` threads (default up to 8; 0 skips prefaulting) and, with `pin`,
    registered with CUDA in chunks of at most `register_chunk_bytes`; the device pool as one
    uint8 buffer on `device` ("cuda", "cuda:N", "cpu" or "meta").

    Everything that can be refused is refused before memory is touched: an unknown device,
    CUDA or pinning where there is no CUDA, a host pool above 95% of available RAM, a device
    pool above the GPU's free memory, a pool no chunking can register. A failure midway frees
    whatever was already allocated. `registrar` replaces CUDA registration (for tests).
    """
    target = parse_device(device)
    check_pin(pin, target, own_registrar=registrar is not None)
    threads = default_prefault_threads() if prefault_threads is None else prefault_threads
    if threads < 0:
        raise BackendError(f"prefault_threads is {threads}; expected 0 (no prefault) or more")
    host_bytes = None if plan.host_pool is None else _pool_bytes(
        plan, True, plan.host_pool.size, "host_pool.size"
    )
    device_bytes = _pool_bytes(plan, False, plan.device_pool.size, "device_pool.size")
    if target.type != "meta":
        in_ram = (host_bytes or 0) + (device_bytes if target.type == "cpu" else 0)
        what = "the host pool" if target.type != "cpu" else "the host and CPU device pools"
        check_host_fits(in_ram, available_host_memory(), what=what)
    chunks: list[Chunk] = []
    if pin and host_bytes is not None:
        chunks = plan_chunks(
            host_bytes, host_trains(plan), chunk_bytes=register_chunk_bytes, os_page=OS_PAGE
        )
    device_pool = allocate_device_pool(device_bytes, target)
    if host_bytes is None:
        return Pools(plan, None, device_pool, None)
    if target.type == "meta":
        return Pools(plan, MetaHostBuffer(host_bytes), device_pool, None)
    buffer = HostBuffer(host_bytes, huge_pages=huge_pages)
    registration = None
    try:
        buffer.prefault(threads)
        if pin:
            registrar = registrar or CudaRegistrar(pin_device_index(target))
            registration = register_chunks(
                buffer.address, chunks, registrar, threads=max(1, threads)
            )
    except BaseException:
        buffer.release()
        raise
    return Pools(plan, buffer, device_pool, registration)


def _pool_bytes(plan: KVCachePlan, host_resident: bool, size: int, name: str) -> int:
    """The pool size the plan states, after checking its tensors agree on it."""
    for index, tensor in enumerate(plan.tensors):
        if tensor.host_resident == host_resident and tensor.size != size:
            raise BackendError(
                f"tensors[{index}] ({tensor.layers[0]!r}) says its pool has {tensor.size} bytes; "
                f"expected {size}, the plan's {name}"
            )
    if size < 1:
        raise BackendError(f"the plan's {name} is {size}; expected at least 1 byte")
    return size
