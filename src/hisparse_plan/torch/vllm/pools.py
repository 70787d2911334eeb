"""A vLLM plan's pools: the host pool and one pipeline stage's device pool, allocated exactly as
planned, and the layer views bound on them."""

from __future__ import annotations

import weakref
from types import TracebackType

import torch

from hisparse_plan.models import KVCachePlan
from hisparse_plan.torch.allocation import Arguments, check_sound
from hisparse_plan.torch.devices import allocate_device_pool
from hisparse_plan.torch.errors import BackendError
from hisparse_plan.torch.hostmem.chunks import Chunk
from hisparse_plan.torch.hostmem.lifecycle import private, register, share
from hisparse_plan.torch.hostmem.mapping import HostBuffer, MetaHostBuffer
from hisparse_plan.torch.hostmem.numa import NumaPlacement
from hisparse_plan.torch.hostmem.ram import (
    DEVICE_POOL_ADVICE,
    available_host_memory,
    check_host_fits,
    gib,
)
from hisparse_plan.torch.hostmem.shm import SharedPool
from hisparse_plan.torch.hostmem.state import HostState, describe, suppress_close_errors
from hisparse_plan.torch.hostmem.tasks import LOG
from hisparse_plan.torch.vllm.binding import bind_view, bind_views
from hisparse_plan.torch.vllm.host import (
    check_host_views,
    check_shared,
    host_pool_bytes,
    host_trains,
)
from hisparse_plan.torch.vllm.stages import refuse_layer, resolve_stage, stage_views
from hisparse_plan.views import pool_name, stage_of, tensor_stage


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


def allocate_vllm(plan: KVCachePlan, arguments: Arguments) -> Pools:
    """`allocate` for a vLLM plan (see `hisparse_plan.torch.allocate`): the host pool sized by
    `host_pool_bytes`, every host view inside it, and the device pool of one pipeline stage."""
    check_sound(plan)
    ask = arguments.checked()
    index = resolve_stage(plan, ask.stage)
    check_shared(plan, ask.host_pool_name, ask.device)
    host_bytes = None
    if plan.host_pool is not None:
        _pool_bytes(plan, True, plan.host_pool.size, "host_pool.size")
        host_bytes = host_pool_bytes(plan)
        check_host_views(plan, host_bytes)
    device_bytes = _device_pool_bytes(plan, index)
    device_name = pool_name(plan, index)
    in_ram = device_bytes if ask.device.type == "cpu" else 0
    chunks: list[Chunk] = []
    if ask.pin and host_bytes is not None:
        chunks = ask.chunks(host_bytes, host_trains(plan))
    if ask.device.type == "meta" or host_bytes is None:
        if ask.device.type != "meta":
            check_host_fits(in_ram, available_host_memory(), what=f"the CPU {device_name} pool",
                            advice=DEVICE_POOL_ADVICE)
        host = None if host_bytes is None else MetaHostBuffer(host_bytes)
        device_pool = allocate_device_pool(device_bytes, ask.device, device_name)
        return _done(plan, HostState(host), device_pool, index)
    if ask.host_pool_name is None:
        what = "the host pool" if ask.device.type != "cpu" else "the host and CPU device pools"
        check_host_fits(host_bytes + in_ram, available_host_memory(), what=what)
        device_pool = allocate_device_pool(device_bytes, ask.device, device_name)
        state = private(HostBuffer(host_bytes, huge_pages=ask.host.huge_pages), ask.host)
    else:
        state, device_pool = share(
            ask.host_pool_name, host_bytes, ask.host, in_ram=in_ram,
            memory=available_host_memory,
            allocate_devices=lambda: allocate_device_pool(device_bytes, ask.device),
        )
    if ask.pin:
        register(state, ask.pinning(), chunks, ask.host)
    return _done(plan, state, device_pool, index)


def _done(plan: KVCachePlan, state: HostState, device_pool: torch.Tensor, stage: int) -> Pools:
    pools = Pools(plan, state, device_pool, stage)
    LOG.info("allocated: %s", pools.summary().replace("\n", "; "))
    return pools


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
