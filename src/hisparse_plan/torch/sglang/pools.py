"""An SGLang plan's pools: every pool allocated as its `allocation` says (a per-layer pool as one
buffer per layer), SGLang's own buffers and each layer's pages bound on them (module `binding`).

The host pools take the same steps as a vLLM plan's (`hostmem`: mapping, NUMA placement,
prefault, chunked CUDA registration, the shared /dev/shm pool and the undo order), so both
engines pin alike.
"""

from __future__ import annotations

import weakref
from types import TracebackType

import torch

from hisparse_plan.models.pools import Pool
from hisparse_plan.models.sglang_plan import SGLangPlan
from hisparse_plan.rules.arith import round_up
from hisparse_plan.torch.allocation import Arguments, check_sound
from hisparse_plan.torch.devices import allocate_device_pool
from hisparse_plan.torch.errors import BackendError
from hisparse_plan.torch.hostmem.chunks import Chunk
from hisparse_plan.torch.hostmem.lifecycle import private, register, share
from hisparse_plan.torch.hostmem.mapping import OS_PAGE, HostBuffer, MetaHostBuffer
from hisparse_plan.torch.hostmem.ram import (
    DEVICE_POOL_ADVICE,
    HOST_POOL_ADVICE,
    available_host_memory,
    check_host_fits,
    gib,
)
from hisparse_plan.torch.hostmem.shm import SharedPool
from hisparse_plan.torch.hostmem.state import HostState, close_all, describe
from hisparse_plan.torch.hostmem.tasks import LOG
from hisparse_plan.torch.sglang.binding import (
    AllocationKey,
    BufferKey,
    allocations,
    bind_buffer,
    bind_pages,
    describe_allocation,
    host_layer_offsets,
    host_trains,
    page_trains,
    placed_views,
)

__all__ = ["SGLangPools", "allocate_sglang"]


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
        self._finalizer = weakref.finalize(self, close_all, list(hosts.values()))

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
            if buffer is None or buffer.tensor is None:
                continue
            size = next(pool.size for pool in self._plan.pools if pool.name == name)
            for layer, start in host_layer_offsets(self._plan, name).items():
                found[(name, layer)] = (buffer.tensor if layer is None
                                        else buffer.tensor[start:start + size])
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
        close_all(list(self._hosts.values()), quiet=False)

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


def allocate_sglang(plan: SGLangPlan, arguments: Arguments) -> SGLangPools:
    """`allocate` for an SGLang plan (see `hisparse_plan.torch.allocate`): device pools on
    `device`, a per-layer pool as one buffer per layer; host pools mapped, placed, prefaulted
    and, with `pin`, registered in chunks that no page range crosses. `host_pool_name` shares
    the plan's one host pool, which must say `shared`. Refusals come before memory is touched:
    an unsound plan, an unknown device, too little RAM or free GPU memory."""
    check_sound(plan)
    ask = arguments.checked()
    index = _resolve_stage(plan, ask.stage)
    host_pools = [pool for pool in plan.pools if pool.location == "host"]
    device_pools = [pool for pool in plan.pools
                    if pool.location == "device" and pool.stage == index]
    _check_host_pool_name(host_pools, ask.host_pool_name, ask.device)
    host_bytes = {pool.name: round_up(pool.size, OS_PAGE) if pool.shared and ask.host_pool_name
                  else pool.size * len(plan.allocation_layers(pool)) for pool in host_pools}
    sizes = {pool.name: pool.size for pool in device_pools}
    device_sizes = {key: sizes[key[0]] for key in allocations(plan, device_pools)}
    in_ram = sum(device_sizes.values()) if ask.device.type == "cpu" else 0
    chunks: dict[str, list[Chunk]] = {
        name: ask.chunks(size, host_trains(plan, name)) for name, size in host_bytes.items()
    } if ask.pin else {}
    _check_device_memory(device_sizes, ask.device)

    def allocate_devices() -> dict[AllocationKey, torch.Tensor]:
        return {key: allocate_device_pool(size, ask.device, describe_allocation(key))
                for key, size in device_sizes.items()}

    if ask.device.type == "meta" or not host_pools:
        if ask.device.type != "meta":
            check_host_fits(in_ram, available_host_memory(), what="the CPU device pools",
                            advice=DEVICE_POOL_ADVICE)
        hosts = {name: HostState(MetaHostBuffer(size)) for name, size in host_bytes.items()}
        return _done(plan, hosts, allocate_devices(), index)
    hosts = {}
    try:
        if ask.host_pool_name is None:
            what = "the host pools" + (" and the CPU device pools" if in_ram else "")
            check_host_fits(sum(host_bytes.values()) + in_ram, available_host_memory(),
                            what=what, advice=HOST_POOL_ADVICE)
            devices = allocate_devices()
            for name, size in host_bytes.items():
                hosts[name] = private(HostBuffer(size, huge_pages=ask.host.huge_pages), ask.host)
        else:
            (name, size), = host_bytes.items()
            hosts[name], devices = share(
                ask.host_pool_name, size, ask.host, in_ram=in_ram,
                memory=available_host_memory, allocate_devices=allocate_devices)
        if ask.pin:
            pinning = ask.pinning()
            for name, state in hosts.items():
                register(state, pinning, chunks[name], ask.host)
    except BaseException:
        # A step undoes the pool it failed on; the ones done before it are closed here.
        close_all(state for state in hosts.values() if state.buffer is not None)
        raise
    return _done(plan, hosts, devices, index)


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
