"""`allocate`: the host and device pools of a plan, exactly as planned, and their views."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, TypeVar, overload

import torch

from hisparse_plan.checking import check_plan
from hisparse_plan.errors import PlanInvariantError
from hisparse_plan.models import KVCachePlan
from hisparse_plan.models.sglang_plan import SGLangPlan
from hisparse_plan.torch.devices import (
    allocate_device_pool,
    check_pin,
    parse_device,
    pin_device_index,
)
from hisparse_plan.torch.errors import BackendError, UnsoundPlanError
from hisparse_plan.torch.hostmem.chunks import CHUNK_BYTES, Chunk, host_trains, plan_chunks
from hisparse_plan.torch.hostmem.lifecycle import (
    HostState,
    attached_placement,
    check_host_views,
    check_shared,
    describe,
    host_pool_bytes,
    suppress_close_errors,
)
from hisparse_plan.torch.hostmem.locks import DEFAULT_LOCK_TIMEOUT_S
from hisparse_plan.torch.hostmem.mapping import (
    OS_PAGE,
    HostBuffer,
    MetaHostBuffer,
    default_prefault_threads,
)
from hisparse_plan.torch.hostmem.numa import NumaPlacement, place
from hisparse_plan.torch.hostmem.ram import (
    DEVICE_POOL_ADVICE,
    available_host_memory,
    check_host_fits,
    gib,
)
from hisparse_plan.torch.hostmem.registration import CudaRegistrar, Registrar, Registration
from hisparse_plan.torch.hostmem.shm import SharedPool, check_free_space, claim
from hisparse_plan.torch.hostmem.tasks import LOG, Progress
from hisparse_plan.torch.vllm.binding import bind_view, bind_views
from hisparse_plan.torch.vllm.stages import refuse_layer, resolve_stage, stage_views
from hisparse_plan.views import pool_name, stage_of, tensor_stage

if TYPE_CHECKING:
    from hisparse_plan.torch.sglang.pools import SGLangPools

Devices = TypeVar("Devices")


class Pools:
    """The allocated pools of one plan. Use as a context manager, or call `release()`.

    `host` is the flat uint8 host pool (None when the plan has none), `device` the flat uint8
    device pool of pipeline stage `stage` (0 for a one-stage plan); both start at storage
    offset 0, so a view's storage offset is the plan's byte offset. Keep this object alive
    while the pools are in use pinned: releasing it (or letting it be collected) unpins the
    host pool and returns its pages; the last process to release a shared host pool removes
    it.

    Built by `allocate` only, for a plan `check_plan` proved sound; `plan` is read-only (and
    the plan frozen), so `views()` never binds two layers' pages onto one byte.
    """

    def __init__(
        self, plan: KVCachePlan, host: HostState, device: torch.Tensor, stage: int = 0
    ) -> None:
        self._plan = plan
        self.stage = stage
        """The pipeline stage whose device pool this is (0 for a one-stage plan)."""
        self._device: torch.Tensor | None = device
        self._state = host
        registration = host.registration
        self._chunks: tuple[Chunk, ...] = (
            () if registration is None else tuple(sorted(registration.chunks,
                                                         key=lambda chunk: chunk.index))
        )
        self.numa: NumaPlacement | None = host.numa
        """Where the host pool's pages were placed; None without a real host pool."""
        self.shared: SharedPool | None = host.shared
        """The shared host pool this process maps (None for a private one)."""
        self.ram_counted: int = host.ram_counted
        """Host pool bytes this process counted against host RAM: 0 where it attached a
        shared pool that another process created (and counted)."""
        self._summary = "\n".join([
            describe(host, len(self._chunks)),
            f"{pool_name(plan, stage)} pool: {gib(device.numel())} on {device.device}",
        ])
        self._finalizer = weakref.finalize(self, suppress_close_errors, self._state)

    @property
    def plan(self) -> KVCachePlan:
        """The plan these pools were allocated for, proven sound by `check_plan`."""
        return self._plan

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

    def summary(self) -> str:
        """What was allocated, one line per pool: sizes, private or shared (created or
        attached), pinned chunks, and the host pool's NUMA node."""
        return self._summary

    def views(self) -> dict[str, torch.Tensor]:
        """Every layer's tensor by name: [num_blocks, H, N, C] in the layer's dtype for
        attention layers, [num_blocks, page_bytes] uint8 for resident and hot layers and for
        Mamba states (their natural bytes). Only this stage's layers (and host layers)."""
        self.check_shared("binding views on it")
        return bind_views(self.plan, self.host, self.device, self.stage)

    def check_shared(self, doing: str = "using it") -> None:
        """Raise `BackendError` if the shared host pool's file no longer has its size: another
        process of this user shrank it, and touching a page past its end would kill this
        process (SIGBUS). Asked before binding views and by `verify`; nothing can stop a
        shrink in between, since any process of the file's owner may resize it."""
        self._check_live()
        self._state.check_size(doing)

    def view(self, name: str) -> torch.Tensor:
        """Layer `name`'s tensor, as in `views()`; a layer of another pipeline stage (or one
        the plan does not place) is a `BackendError` naming it and its stage."""
        view = stage_views(self.plan, self.stage).get(name)
        if view is None:
            raise refuse_layer(self.plan, name, self.stage)
        pool = self.host if view.host_resident else self.device
        if pool is None:
            raise BackendError(f"layer {name!r} is host-resident, but there is no host pool "
                               "buffer; expected a plan with a host_pool")
        if view.host_resident:
            self.check_shared("binding a view on it")
        return bind_view(view, pool)

    def release(self) -> None:
        """Unpin and free the host pool (a shared one is removed by the last process to let go
        of it) and drop the device pool. Idempotent."""
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


@overload
def allocate(
    plan: KVCachePlan, *, device: str = ..., pin: bool = ..., register_chunk_bytes: int = ...,
    prefault_threads: int | None = ..., huge_pages: bool = ..., registrar: Registrar | None = ...,
    host_pool_name: str | None = ..., numa_node: int | None = ...,
    progress: Progress | None = ..., stage: int | None = ..., lock_timeout_s: float = ...,
) -> Pools: ...


@overload
def allocate(
    plan: SGLangPlan, *, device: str = ..., pin: bool = ..., register_chunk_bytes: int = ...,
    prefault_threads: int | None = ..., huge_pages: bool = ..., registrar: Registrar | None = ...,
    host_pool_name: str | None = ..., numa_node: int | None = ...,
    progress: Progress | None = ..., stage: int | None = ..., lock_timeout_s: float = ...,
) -> SGLangPools: ...


def allocate(
    plan: KVCachePlan | SGLangPlan,
    *,
    device: str = "cuda",
    pin: bool = True,
    register_chunk_bytes: int = CHUNK_BYTES,
    prefault_threads: int | None = None,
    huge_pages: bool = True,
    registrar: Registrar | None = None,
    host_pool_name: str | None = None,
    numa_node: int | None = None,
    progress: Progress | None = None,
    stage: int | None = None,
    lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
) -> Pools | SGLangPools:
    """Allocate the plan's pools: the host pool page-aligned and sized by `host_pool_bytes`,
    placed on a NUMA node, prefaulted on `prefault_threads` threads (default up to 8; 0 skips
    prefaulting) and, with `pin`, registered with CUDA in chunks of at most
    `register_chunk_bytes`; the device pool as one uint8 buffer on `device` ("cuda", "cuda:N",
    "cpu" or "meta").

    `stage`: a plan with pipeline stages has one device pool per stage, each for its own
    process; `stage=k` allocates only stage k's (`plan.device_pools[k].size` bytes), and the
    pools then bind and verify only stage k's layers. Required for such a plan; a one-stage
    plan takes None or 0.

    `host_pool_name`: for a plan whose `host_pool.shared` is true, the host pool lives in
    shared memory under that name (module `shm`): the first process creates it, the others
    attach it (same size required), each registers it with CUDA for itself, and the last to
    release it removes it. Its files are this user's alone (mode 0600, no symbolic links, the
    planned size); a name another user took is refused saying so, and the lock that orders
    the ranks is waited for at most `lock_timeout_s` seconds. `numa_node`: None places the
    host pool on the node of the GPU the device pool is on where the machine says which (a
    preference; where it cannot, a WARNING and the summary says why); a number binds it there
    or raises. `progress(step, done, total)` reports the "prefault" and "register" steps.

    Everything that can be refused is refused before memory is touched: a plan `check_plan`
    refuses (`UnsoundPlanError`, with check_plan's message; the proof costs the same for any
    num_blocks), an unknown device, CUDA or pinning where there is no CUDA, a host pool above
    95% of available RAM (a shared pool counts only in the process that creates it), a device
    pool above the GPU's free memory, a pool no chunking can register. A failure or interrupt
    midway (Ctrl-C included) frees whatever was already allocated, unregistering before
    unmapping. `registrar` replaces CUDA registration (for tests).

    An `SGLangPlan` is allocated by `sglang_pools.allocate_sglang`, with the same arguments and
    refusals: every pool as its `allocation` says, SGLang's buffers bound by `buffers()`.
    """
    if isinstance(plan, SGLangPlan):
        # Imported here: the SGLang target builds on this module's host-pool steps.
        from hisparse_plan.torch.sglang.pools import allocate_sglang

        return allocate_sglang(
            plan, device=device, pin=pin, register_chunk_bytes=register_chunk_bytes,
            prefault_threads=prefault_threads, huge_pages=huge_pages, registrar=registrar,
            host_pool_name=host_pool_name, numa_node=numa_node, progress=progress, stage=stage,
            lock_timeout_s=lock_timeout_s,
        )
    target, threads = checked_arguments(plan, device, pin, registrar, prefault_threads,
                                        numa_node)
    index = resolve_stage(plan, stage)
    check_shared(plan, host_pool_name, target)
    host_bytes = None
    if plan.host_pool is not None:
        _pool_bytes(plan, True, plan.host_pool.size, "host_pool.size")
        host_bytes = host_pool_bytes(plan)
        check_host_views(plan, host_bytes)
    device_bytes = _device_pool_bytes(plan, index)
    device_name = pool_name(plan, index)
    in_ram = device_bytes if target.type == "cpu" else 0
    chunks: list[Chunk] = []
    if pin and host_bytes is not None:
        chunks = plan_chunks(
            host_bytes, host_trains(plan), chunk_bytes=register_chunk_bytes, os_page=OS_PAGE
        )
    if target.type == "meta" or host_bytes is None:
        if target.type != "meta":
            check_host_fits(in_ram, available_host_memory(), what=f"the CPU {device_name} pool",
                            advice=DEVICE_POOL_ADVICE)
        host = None if host_bytes is None else MetaHostBuffer(host_bytes)
        device_pool = allocate_device_pool(device_bytes, target, device_name)
        return _done(plan, HostState(host), device_pool, index)
    gpu = target.index if target.type == "cuda" else None
    if host_pool_name is None:
        what = "the host pool" if target.type != "cpu" else "the host and CPU device pools"
        check_host_fits(host_bytes + in_ram, available_host_memory(), what=what)
        device_pool = allocate_device_pool(device_bytes, target, device_name)
        state = HostState(HostBuffer(host_bytes, huge_pages=huge_pages), ram_counted=host_bytes)
        guarded(state, lambda buffer: place_and_prefault(
            state, buffer, numa_node, gpu, threads, progress))
    else:
        state, device_pool = shared_host(
            host_pool_name, host_bytes, target, in_ram, huge_pages, numa_node, threads,
            progress, lock_timeout_s, lambda: allocate_device_pool(device_bytes, target),
        )
    if pin:
        pinning: Registrar = registrar or CudaRegistrar(pin_device_index(target))
        guarded(state, lambda buffer: register(
            state, Registration(buffer.address, pinning), chunks, threads, progress))
    return _done(plan, state, device_pool, index)


def checked_arguments(
    plan: KVCachePlan | SGLangPlan, device: str, pin: bool, registrar: Registrar | None,
    prefault_threads: int | None, numa_node: int | None,
) -> tuple[torch.device, int]:
    """What `allocate` refuses before anything else, for either engine's plan: an unsound
    plan, an unknown device, pinning without CUDA, a negative thread count or NUMA node. Gives
    the device and the prefault threads (default up to 8)."""
    check_sound(plan)
    target = parse_device(device)
    check_pin(pin, target, own_registrar=registrar is not None)
    threads = default_prefault_threads() if prefault_threads is None else prefault_threads
    if threads < 0:
        raise BackendError(f"prefault_threads is {threads}; expected 0 (no prefault) or more")
    if numa_node is not None and numa_node < 0:
        raise BackendError(f"numa_node is {numa_node}; expected None (follow the GPU) or a "
                           "node number, 0 or more")
    return target, threads


def check_sound(plan: KVCachePlan | SGLangPlan) -> None:
    """Refuse a plan `check_plan` refuses (layer_stride 0 loaded from JSON, say): its views
    could overlap across block ids, and only `verify` would notice, after the fact."""
    try:
        check_plan(plan)
    except PlanInvariantError as error:
        raise UnsoundPlanError(
            f"allocate refuses a plan that check_plan does not prove sound: {error}",
            tensor=error.tensor, layer=error.layer, block=error.block,
        ) from error


def _done(plan: KVCachePlan, state: HostState, device_pool: torch.Tensor, stage: int) -> Pools:
    pools = Pools(plan, state, device_pool, stage)
    LOG.info("allocated: %s", pools.summary().replace("\n", "; "))
    return pools


def shared_host(
    name: str, host_bytes: int, target: torch.device, in_ram: int, huge_pages: bool,
    numa_node: int | None, threads: int, progress: Progress | None, lock_timeout_s: float,
    allocate_devices: Callable[[], Devices],
) -> tuple[HostState, Devices]:
    """Create or attach the shared host pool, and allocate the device pools meanwhile with
    `allocate_devices` (after the RAM check, which depends on whether this process creates the
    pool)."""
    gpu = target.index if target.type == "cuda" else None
    with claim(name, lock_timeout_s=lock_timeout_s) as held:
        creating = held.existing is None
        counted = host_bytes if creating else 0
        what = f"the shared host pool {name!r}" + (" (created here)" if creating else
                                                   " (attached: counted where created)")
        if target.type == "cpu":
            what += " and the CPU device pool"
        check_host_fits(counted + in_ram, available_host_memory(), what=what)
        if creating:
            check_free_space(host_bytes)
        device_pool = allocate_devices()
        segment = held.create(host_bytes) if creating else held.attach(host_bytes)
        state = HostState(HostBuffer(host_bytes, huge_pages=huge_pages, segment=segment),
                          segment=segment, ram_counted=counted)
        if creating:
            # Under the guard: no other process touches a page before it is placed.
            guarded(state, lambda buffer: place_and_prefault(
                state, buffer, numa_node, gpu, threads, progress), keep_segment=True)
    if not creating:
        def attach(buffer: HostBuffer) -> None:
            buffer.prefault(threads, progress)
            state.numa = attached_placement(buffer.address, numa_node)

        guarded(state, attach)
    return state, device_pool


def place_and_prefault(
    state: HostState, buffer: HostBuffer, numa_node: int | None, gpu: int | None,
    threads: int, progress: Progress | None,
) -> None:
    state.numa = place(buffer.address, buffer.nbytes, requested=numa_node, gpu_index=gpu)
    buffer.prefault(threads, progress)


def register(
    state: HostState, registration: Registration, chunks: list[Chunk], threads: int,
    progress: Progress | None,
) -> None:
    state.check_size("registering it with CUDA")
    # Held by the state before the first call, so an undo sees every chunk it registers.
    state.registration = registration
    registration.register(chunks, threads=max(1, threads), progress=progress)


def guarded(state: HostState, step: Callable[[HostBuffer], None], *,
             keep_segment: bool = False) -> None:
    """Run one allocation step; on any exception or interrupt undo the host pool (unless some
    chunk may still be registered) and re-raise. `keep_segment` leaves the shared pool's hold
    to the enclosing claim, which lets go of it under its guard."""
    buffer = state.buffer
    if not isinstance(buffer, HostBuffer):
        raise BackendError("the host pool buffer is missing; expected a mapped host pool")
    try:
        step(buffer)
    except BaseException:
        if keep_segment:
            state.segment = None
        state.abort()
        raise


def _device_pool_bytes(plan: KVCachePlan, stage: int) -> int:
    if len(plan.device_pools) == 1:
        return _pool_bytes(plan, False, plan.device_pool.size, "device_pool.size")
    return _pool_bytes(plan, False, plan.device_pools[stage].size,
                       f"device_pools[{stage}].size", stage)


def _pool_bytes(
    plan: KVCachePlan, host_resident: bool, size: int, name: str, stage: int = 0
) -> int:
    """The pool size the plan states, after checking that its tensors (on the device, those
    of pipeline stage `stage`) agree on it."""
    stages = stage_of(plan)
    for index, tensor in enumerate(plan.tensors):
        if tensor.host_resident != host_resident or (
            not host_resident and tensor_stage(plan, index, stages) != stage
        ):
            continue
        if tensor.size != size:
            raise BackendError(
                f"tensors[{index}] ({tensor.layers[0]!r}) says its pool has {tensor.size} bytes; "
                f"expected {size}, the plan's {name}"
            )
    if size < 1:
        raise BackendError(f"the plan's {name} is {size}; expected at least 1 byte")
    return size
