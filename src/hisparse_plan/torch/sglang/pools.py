"""SGLang plans on the torch backend: every pool allocated as its `allocation` says, SGLang's own
buffers bound as the plan's `BufferView`s, and each layer's pages as byte views for `verify`.

A per-layer pool is one flat uint8 buffer per layer of its tensors (SGLang keeps a list of
tensors, one per layer); a whole pool is one flat buffer. Every buffer starts at storage offset
0, so a view's storage offset in the plan is its storage offset in torch. The host pool goes
through the vLLM host pool's own steps (mapping, NUMA placement, prefault, chunked CUDA
registration, the shared /dev/shm pool and the undo order), so both engines pin alike.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType

import torch

from hisparse_plan.models.pools import BUFFER_DTYPE_SIZE, BufferDType, BufferView, Pool
from hisparse_plan.models.sglang_plan import SGLangPlan
from hisparse_plan.rules.arith import round_up
from hisparse_plan.torch.devices import (
    allocate_device_pool,
    pin_device_index,
)
from hisparse_plan.torch.errors import BackendError
from hisparse_plan.torch.hostmem.chunks import CHUNK_BYTES, Chunk, plan_chunks
from hisparse_plan.torch.hostmem.lifecycle import HostState, describe, suppress_close_errors
from hisparse_plan.torch.hostmem.locks import DEFAULT_LOCK_TIMEOUT_S
from hisparse_plan.torch.hostmem.mapping import OS_PAGE, HostBuffer, MetaHostBuffer
from hisparse_plan.torch.hostmem.ram import (
    DEVICE_POOL_ADVICE,
    HOST_POOL_ADVICE,
    available_host_memory,
    check_host_fits,
    gib,
)
from hisparse_plan.torch.hostmem.registration import CudaRegistrar, Registrar, Registration
from hisparse_plan.torch.hostmem.shm import SharedPool
from hisparse_plan.torch.hostmem.tasks import LOG, Progress
from hisparse_plan.torch.vllm.pools import (
    checked_arguments,
    guarded,
    place_and_prefault,
    register,
    shared_host,
)
from hisparse_plan.views import Train

AllocationKey = tuple[str, str | None]
"""(pool name, layer): the layer's own buffer of a per-layer pool, or None for a whole pool."""
BufferKey = tuple[str, str | None, str]
"""(pool name, layer or None, view name): one of SGLang's tensors, e.g. ("kv", "model.layers.0
.self_attn.attn", "k_buffer"); a whole pool's views span every layer and have None."""

BUFFER_TORCH_DTYPES: dict[BufferDType, torch.dtype] = {
    "uint8": torch.uint8, "int8": torch.int8, "float8_e4m3fn": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2, "bfloat16": torch.bfloat16, "float16": torch.float16,
    "int16": torch.int16, "float32": torch.float32, "int32": torch.int32,
    "float64": torch.float64, "int64": torch.int64,
}


@dataclass(frozen=True, slots=True)
class PageTrain:
    """One range of one layer's pages in one allocation: block `b`'s part is `size` bytes at
    byte `start + b * block_stride` of the allocation."""

    allocation: AllocationKey
    tensor: int
    layer: str
    range: int
    start: int
    size: int
    block_stride: int
    num_blocks: int
    host_resident: bool
    stage: int

    def where(self) -> str:
        return (f"tensors[{self.tensor}] layer {self.layer!r} range {self.range} in "
                f"{describe_allocation(self.allocation)}")


@dataclass(frozen=True, slots=True)
class PlacedView:
    """A `BufferView` of tensor `tensor` on allocation `allocation`."""

    key: BufferKey
    allocation: AllocationKey
    tensor: int
    view: BufferView


def describe_allocation(key: AllocationKey) -> str:
    pool, layer = key
    return f"pool {pool!r}" if layer is None else f"pool {pool!r} (layer {layer!r})"


def allocations(plan: SGLangPlan, pools: Sequence[Pool]) -> list[AllocationKey]:
    """The allocations of `pools`, in plan order: one per layer of a per-layer pool's tensors,
    one for a whole pool."""
    return [(pool.name, layer) for pool in pools for layer in plan.allocation_layers(pool)]


def page_trains(plan: SGLangPlan) -> list[PageTrain]:
    """Every range of every layer's pages, in plan order."""
    pools = {pool.name: pool for pool in plan.pools}
    trains = []
    for index, tensor in enumerate(plan.tensors):
        pool = pools[tensor.pool]
        for position, layer in enumerate(tensor.layers):
            key: AllocationKey = (pool.name, layer if pool.allocation == "per_layer" else None)
            for number, part in enumerate(tensor.ranges or []):
                trains.append(PageTrain(
                    key, index, layer, number,
                    tensor.offset + position * tensor.layer_stride + part.offset, part.size,
                    tensor.block_stride, pool.num_blocks, pool.location == "host", pool.stage,
                ))
    return trains


def placed_views(plan: SGLangPlan) -> list[PlacedView]:
    """Every SGLang buffer on every allocation, in plan order: a per-layer pool's views once
    per layer, a whole pool's once."""
    pools = {pool.name: pool for pool in plan.pools}
    placed = []
    for index, tensor in enumerate(plan.tensors):
        pool = pools[tensor.pool]
        layers: list[str | None] = (
            list(tensor.layers) if pool.allocation == "per_layer" else [None])
        for layer in layers:
            for view in tensor.views:
                placed.append(PlacedView((pool.name, layer, view.name), (pool.name, layer),
                                         index, view))
    return placed


def bind_buffer(placed: PlacedView, allocation: torch.Tensor) -> torch.Tensor:
    """SGLang's tensor: the plan's dtype, shape, strides and storage offset (in elements) on
    the allocation's own storage, after proving it lies inside."""
    view = placed.view
    where = f"view {view.name!r} of tensors[{placed.tensor}] on " + describe_allocation(
        placed.allocation)
    if len(view.shape) != len(view.strides):
        raise BackendError(f"{where}: {len(view.shape)} dims but {len(view.strides)} strides; "
                           "expected one stride per dim")
    nbytes = allocation.numel()
    end = view.end_byte
    if end > nbytes:
        raise BackendError(f"{where} ends at byte {end}, past the allocation's {nbytes} bytes; "
                           "expected it inside")
    itemsize = BUFFER_DTYPE_SIZE[view.dtype]
    dtype = BUFFER_TORCH_DTYPES[view.dtype]
    # A typed view of the whole allocation, cut to whole elements: as_strided then counts the
    # storage offset in elements of the dtype, as SGLang's tensors do. Its storage offset is
    # absolute in the storage, so the allocation's own start is added (an allocation may be a
    # slice of a larger buffer, as page views and vLLM views allow too).
    typed = allocation[: nbytes // itemsize * itemsize].view(dtype)
    return typed.as_strided(view.shape, view.strides,
                            typed.storage_offset() + view.storage_offset)


def check_buffer(placed: PlacedView, tensor: torch.Tensor, allocation: torch.Tensor) -> None:
    """The bound tensor is exactly the plan's view: dtype, shape, strides, storage offset, and
    the allocation's own storage."""
    view = placed.view
    got = {
        "dtype": tensor.dtype, "shape": list(tensor.shape), "strides": list(tensor.stride()),
        # In bytes from the allocation's start: the two offsets count different element sizes.
        "start byte": tensor.storage_offset() * tensor.element_size()
        - allocation.storage_offset(),
        "storage bytes": tensor.untyped_storage().nbytes(),
    }
    expected = {
        "dtype": BUFFER_TORCH_DTYPES[view.dtype], "shape": list(view.shape),
        "strides": list(view.strides),
        "start byte": view.storage_offset * BUFFER_DTYPE_SIZE[view.dtype],
        "storage bytes": allocation.untyped_storage().nbytes(),
    }
    where = f"view {view.name!r} of tensors[{placed.tensor}] on " + describe_allocation(
        placed.allocation)
    for what, value in expected.items():
        if got[what] != value:
            raise BackendError(f"{where}: the bound tensor's {what} is {got[what]}; expected "
                               f"{value} from the plan")
    if tensor.device.type != "meta" and (
        tensor.untyped_storage().data_ptr() != allocation.untyped_storage().data_ptr()
    ):
        raise BackendError(f"{where}: the bound tensor is not on its allocation's storage")


def check_train_fits(train: PageTrain, nbytes: int) -> None:
    """Every block's part of the range inside the allocation."""
    end = train.start + (train.num_blocks - 1) * train.block_stride + train.size
    if end > nbytes:
        raise BackendError(
            f"{train.where()}: block {train.num_blocks - 1}'s part ends at byte {end}, past "
            f"the allocation's {nbytes} bytes; expected all {train.num_blocks} blocks inside "
            f"(start {train.start}, block stride {train.block_stride})"
        )


def bind_pages(train: PageTrain, allocation: torch.Tensor) -> torch.Tensor:
    """The range's parts of every block as [num_blocks, size] bytes of the allocation."""
    check_train_fits(train, allocation.numel())
    return allocation.as_strided((train.num_blocks, train.size), (train.block_stride, 1),
                                 allocation.storage_offset() + train.start)


class SGLangPools:
    """The allocated pools of one SGLang plan. Use as a context manager, or call `release()`.

    `allocation(pool, layer)` is a flat uint8 buffer (layer None for a whole pool);
    `buffers()` binds SGLang's own tensors on them, `pages(layer)` a layer's page ranges.
    Keep this object alive while the pools are in use pinned: releasing it (or letting it be
    collected) unpins the host pool and returns its pages.
    """

    def __init__(
        self, plan: SGLangPlan, hosts: dict[str, HostState],
        devices: dict[AllocationKey, torch.Tensor], stage: int,
    ) -> None:
        self._plan = plan
        self.stage = stage
        """The pipeline stage whose device pools these are (0 for SGLang's one stage)."""
        self._devices: dict[AllocationKey, torch.Tensor] | None = devices
        self._hosts = hosts
        self._chunks: dict[str, tuple[Chunk, ...]] = {
            name: () if state.registration is None else tuple(
                sorted(state.registration.chunks, key=lambda chunk: chunk.index))
            for name, state in hosts.items()
        }
        placements = [state.numa for state in hosts.values() if state.numa is not None]
        self.numa = placements[0] if placements else None
        """Where the (first) host pool's pages were placed; None without a real host pool."""
        shared = [state.shared for state in hosts.values() if state.shared is not None]
        self.shared: SharedPool | None = shared[0] if shared else None
        """The shared host pool this process maps (None for private ones)."""
        self.ram_counted = sum(state.ram_counted for state in hosts.values())
        """Host pool bytes this process counted against host RAM."""
        lines = [f"{name}: {describe(state, len(self._chunks[name]))}"
                 for name, state in hosts.items()]
        by_pool: dict[str, list[torch.Tensor]] = {}
        for (pool, _), buffer in devices.items():
            by_pool.setdefault(pool, []).append(buffer)
        for pool, buffers in by_pool.items():
            total = sum(buffer.numel() for buffer in buffers)
            lines.append(f"{pool} pool: {len(buffers)} buffer(s), {gib(total)} on "
                         f"{buffers[0].device}")
        self._summary = "\n".join(lines)
        self._finalizer = weakref.finalize(self, _close_all, list(hosts.values()))

    @property
    def plan(self) -> SGLangPlan:
        """The plan these pools were allocated for, proven sound by `check_plan`."""
        return self._plan

    @property
    def released(self) -> bool:
        return self._devices is None

    @property
    def pinned(self) -> bool:
        """True when every host pool is registered with CUDA (False without host pools)."""
        return not self.released and bool(self._hosts) and all(
            state.registration is not None for state in self._hosts.values())

    @property
    def chunks(self) -> tuple[Chunk, ...]:
        """The registration chunks of the host pools, in plan order (empty when not pinned)."""
        if self.released:
            return ()
        return tuple(chunk for name in self._hosts for chunk in self._chunks[name])

    @property
    def device_type(self) -> str:
        """"cpu", "cuda" or "meta": where the device pools are."""
        devices = self._live()
        first = next(iter(devices.values()), None)
        if first is not None:
            return first.device.type
        return "meta" if any(isinstance(state.buffer, MetaHostBuffer)
                             for state in self._hosts.values()) else "cpu"

    def summary(self) -> str:
        """What was allocated, one line per pool."""
        return self._summary

    def allocations(self) -> dict[AllocationKey, torch.Tensor]:
        """Every allocation by (pool, layer): flat uint8 buffers, host pools included."""
        found = dict(self._live())
        for name, state in self._hosts.items():
            buffer = state.buffer
            if buffer is not None and buffer.tensor is not None:
                found[(name, None)] = buffer.tensor
        return {key: found[key] for key in allocations(self._plan, self._plan.pools)
                if key in found}

    def allocation(self, pool: str, layer: str | None = None) -> torch.Tensor:
        """One allocation: `layer` names the layer's buffer of a per-layer pool, None a whole
        pool's buffer."""
        found = self.allocations().get((pool, layer))
        if found is None:
            known = ", ".join(describe_allocation(key) for key in self.allocations())
            raise BackendError(f"no allocation {describe_allocation((pool, layer))} in these "
                               f"pools; expected one of: {known}")
        if layer is None and pool in self._hosts:
            self.check_shared("using it")
        return found

    def buffers(self) -> dict[BufferKey, torch.Tensor]:
        """SGLang's own tensors, by (pool, layer, view name): each exactly the plan's dtype,
        shape, strides and storage offset on its allocation (K and V halves of one fused
        allocation share its storage)."""
        self.check_shared("binding views on it")
        held = self.allocations()
        bound: dict[BufferKey, torch.Tensor] = {}
        for placed in placed_views(self._plan):
            allocation = held.get(placed.allocation)
            if allocation is None:
                continue  # another pipeline stage's pool
            if placed.key in bound:
                raise BackendError(
                    f"two views named {placed.key[2]!r} on {describe_allocation(placed.allocation)}"
                    "; expected one view of each name per allocation")
            bound[placed.key] = bind_buffer(placed, allocation)
        return bound

    def pages(self, layer: str) -> dict[tuple[str, int], torch.Tensor]:
        """Layer `layer`'s pages, by (pool, range index): [num_blocks, range bytes] uint8 views,
        row b the range's part of block b (SGLang's page b; slot b of a Mamba pool)."""
        held = self.allocations()
        found = {
            (train.allocation[0], train.range): bind_pages(train, held[train.allocation])
            for train in page_trains(self._plan)
            if train.layer == layer and train.allocation in held
        }
        if not found:
            raise BackendError(f"layer {layer!r} has no pages in these pools; expected a layer "
                               "of plan.tensors")
        return found

    def check_shared(self, doing: str = "using it") -> None:
        """Raise `BackendError` if a shared host pool's file no longer has its size (see
        `Pools.check_shared`)."""
        self._live()
        for state in self._hosts.values():
            state.check_size(doing)

    def release(self) -> None:
        """Unpin and free the host pools and drop the device buffers. Idempotent."""
        if self._devices is None:
            return
        self._devices = None
        self._finalizer.detach()
        _close_all(list(self._hosts.values()), quiet=False)

    def _live(self) -> dict[AllocationKey, torch.Tensor]:
        if self._devices is None:
            raise BackendError("the pools were released; allocate them again")
        return self._devices

    def __enter__(self) -> SGLangPools:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.release()


def _close_all(states: list[HostState], quiet: bool = True) -> None:
    """Close every host pool; the first error (after trying all) is raised unless `quiet`."""
    first: BaseException | None = None
    for state in states:
        if quiet:
            suppress_close_errors(state)
            continue
        try:
            state.close()
        except BaseException as error:  # the rest must still be closed
            first = first or error
    if first is not None:
        raise first


def _resolve_stage(plan: SGLangPlan, stage: int | None) -> int:
    stages = sorted({pool.stage for pool in plan.pools if pool.location == "device"}) or [0]
    if stage is None:
        if len(stages) == 1:
            return stages[0]
        raise BackendError(f"the plan's device pools are of stages {stages}; expected stage= "
                           "naming the one to allocate")
    if isinstance(stage, bool) or not isinstance(stage, int) or stage not in stages:
        raise BackendError(f"stage is {stage!r}; expected one of the plan's device pool stages "
                           f"{stages} (or None)")
    return stage


def _host_trains(plan: SGLangPlan, pool: str) -> list[Train]:
    return [Train(train.start, train.size, train.block_stride, train.num_blocks, train.tensor,
                  train.layer, 0)
            for train in page_trains(plan) if train.allocation == (pool, None)]


def _check_device_memory(sizes: dict[AllocationKey, int], target: torch.device) -> None:
    """All device buffers at once against the GPU's free memory, naming what they add up to."""
    if target.type != "cuda" or not sizes:
        return
    free, total = torch.cuda.mem_get_info(target)
    need = sum(sizes.values())
    if need > free:
        by_pool: dict[str, int] = {}
        for (pool, _), size in sizes.items():
            by_pool[pool] = by_pool.get(pool, 0) + size
        parts = ", ".join(f"{pool} {size} bytes" for pool, size in by_pool.items())
        raise BackendError(
            f"the SGLang device pools need {gib(need)} ({parts}), but {target} has {gib(free)} "
            f"free of {gib(total)}; expected the plan's budget to fit what is free"
        )


def allocate_sglang(
    plan: SGLangPlan,
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
) -> SGLangPools:
    """`allocate` for an SGLang plan (see `hisparse_plan.torch.allocate`): device pools on
    `device`, a per-layer pool as one buffer per layer; host pools mapped, placed, prefaulted
    and, with `pin`, registered in chunks that no page range crosses. `host_pool_name` shares
    the plan's one host pool, which must say `shared`. Refusals come before memory is touched:
    an unsound plan, an unknown device, too little RAM or free GPU memory."""
    target, threads = checked_arguments(plan, device, pin, registrar, prefault_threads,
                                        numa_node)
    index = _resolve_stage(plan, stage)
    host_pools = [pool for pool in plan.pools if pool.location == "host"]
    device_pools = [pool for pool in plan.pools
                    if pool.location == "device" and pool.stage == index]
    _check_host_pool_name(host_pools, host_pool_name, target)
    host_bytes = {pool.name: round_up(pool.size, OS_PAGE) if pool.shared and host_pool_name
                  else pool.size for pool in host_pools}
    sizes = {pool.name: pool.size for pool in device_pools}
    device_sizes = {key: sizes[key[0]] for key in allocations(plan, device_pools)}
    in_ram = sum(device_sizes.values()) if target.type == "cpu" else 0
    chunks = {
        pool.name: plan_chunks(host_bytes[pool.name], _host_trains(plan, pool.name),
                               chunk_bytes=register_chunk_bytes, os_page=OS_PAGE)
        for pool in host_pools
    } if pin else {}
    _check_device_memory(device_sizes, target)

    def allocate_devices() -> dict[AllocationKey, torch.Tensor]:
        return {key: allocate_device_pool(size, target, describe_allocation(key))
                for key, size in device_sizes.items()}

    if target.type == "meta" or not host_pools:
        if target.type != "meta":
            check_host_fits(in_ram, available_host_memory(), what="the CPU device pools",
                            advice=DEVICE_POOL_ADVICE)
        hosts = {name: HostState(MetaHostBuffer(size)) for name, size in host_bytes.items()}
        return _done(plan, hosts, allocate_devices(), index)
    gpu = target.index if target.type == "cuda" else None
    hosts = {}
    try:
        if host_pool_name is None:
            what = "the host pools" + (" and the CPU device pools" if in_ram else "")
            check_host_fits(sum(host_bytes.values()) + in_ram, available_host_memory(),
                            what=what, advice=HOST_POOL_ADVICE)
            devices = allocate_devices()
            for name, size in host_bytes.items():
                state = HostState(HostBuffer(size, huge_pages=huge_pages), ram_counted=size)
                hosts[name] = state
                guarded(state, _prefault_step(state, numa_node, gpu, threads, progress))
        else:
            (name, size), = host_bytes.items()
            state, devices = shared_host(
                host_pool_name, size, target, in_ram, huge_pages, numa_node, threads, progress,
                lock_timeout_s, allocate_devices)
            hosts[name] = state
        if pin:
            pinning: Registrar = registrar or CudaRegistrar(pin_device_index(target))
            for name, state in hosts.items():
                guarded(state, _register_step(state, pinning, chunks[name], threads, progress))
    except BaseException:
        # `guarded` undid the pool that failed; the ones done before it are closed here.
        for state in hosts.values():
            if state.buffer is not None:
                suppress_close_errors(state)
        raise
    return _done(plan, hosts, devices, index)


def _prefault_step(
    state: HostState, numa_node: int | None, gpu: int | None, threads: int,
    progress: Progress | None,
) -> Callable[[HostBuffer], None]:
    def step(buffer: HostBuffer) -> None:
        place_and_prefault(state, buffer, numa_node, gpu, threads, progress)

    return step


def _register_step(
    state: HostState, pinning: Registrar, chunks: list[Chunk], threads: int,
    progress: Progress | None,
) -> Callable[[HostBuffer], None]:
    def step(buffer: HostBuffer) -> None:
        register(state, Registration(buffer.address, pinning), chunks, threads, progress)

    return step


def _check_host_pool_name(
    host_pools: list[Pool], name: str | None, target: torch.device
) -> None:
    if name is None:
        return
    if len(host_pools) != 1 or not host_pools[0].shared:
        raise BackendError(
            f"host_pool_name={name!r} asks for a shared host pool; expected a plan with one "
            f"host pool marked shared, got {len(host_pools)} host pool(s)"
            + ("" if len(host_pools) != 1 else " not marked shared")
        )
    if target.type == "meta":
        raise BackendError(
            f"host_pool_name={name!r} with device='meta': meta pools hold no memory to share")


def _done(
    plan: SGLangPlan, hosts: dict[str, HostState], devices: dict[AllocationKey, torch.Tensor],
    stage: int,
) -> SGLangPools:
    pools = SGLangPools(plan, hosts, devices, stage)
    LOG.info("allocated: %s", pools.summary().replace("\n", "; "))
    return pools
