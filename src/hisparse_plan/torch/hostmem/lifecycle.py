"""A host pool's life, in the order it runs. Nothing here knows a plan: a pool is a number of
bytes, and the caller says where its pages go and how they are pinned.

1. Fit: `check_host_fits` (module `ram`) refuses, before a page exists, a pool the machine or
   its cgroup cannot back.
2. Map: a private pool is one anonymous mapping of exactly its bytes (`HostBuffer`, module
   `mapping`), made by the caller; `private` takes it from there. A shared pool is mapped by
   `share` from its /dev/shm file, under the lock that orders the ranks (module `shm`).
3. Place: the untouched mapping is bound to a NUMA node (module `numa`), before any page
   exists, so that prefaulting puts every page there.
4. Prefault: every page is committed now, on threads (`HostBuffer.prefault`), so that a pool
   the machine cannot back fails at start-up rather than in the OOM killer hours later.
5. Share: the first rank creates the pool and places and prefaults it before any other rank
   sees it; the others attach it and read where it was placed.
6. Register: pinned with CUDA in chunks (modules `chunks`, `registration`), all or nothing.
7. Release: `HostState.close` (module `state`) unregisters every chunk, then unmaps, then lets
   go of a shared pool, whose last holder removes it.

A step that fails, or is interrupted, undoes what the pool holds so far (`guarded`), never
unmapping memory that may still be registered.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from hisparse_plan.torch.errors import BackendError
from hisparse_plan.torch.hostmem.chunks import Chunk
from hisparse_plan.torch.hostmem.mapping import HostBuffer
from hisparse_plan.torch.hostmem.numa import attached_placement, place
from hisparse_plan.torch.hostmem.ram import HostMemory, check_host_fits
from hisparse_plan.torch.hostmem.registration import Registrar, Registration
from hisparse_plan.torch.hostmem.shm import check_free_space, claim
from hisparse_plan.torch.hostmem.state import HostState
from hisparse_plan.torch.hostmem.tasks import Progress

Devices = TypeVar("Devices")


@dataclass(frozen=True, slots=True)
class HostOptions:
    """How one allocation maps, places, prefaults and pins its host pools."""

    huge_pages: bool
    """Ask for transparent huge pages (module `mapping`)."""
    numa_node: int | None
    """The node asked for (bound, or an error); None follows the GPU where it can."""
    gpu: int | None
    """The CUDA device the pools serve, whose node is followed; None when they serve none."""
    threads: int
    """Prefault and registration threads; 0 leaves the pages to fault on first use."""
    progress: Progress | None
    """Told of the "prefault" and "register" steps."""
    lock_timeout_s: float
    """The longest wait for a shared pool's lock."""


def private(buffer: HostBuffer, how: HostOptions) -> HostState:
    """A private pool, just mapped (steps 1 and 2 are the caller's): placed and prefaulted
    (steps 3 and 4), and counted against this process's RAM."""
    state = HostState(buffer, ram_counted=buffer.nbytes)
    guarded(state, lambda mapped: place_and_prefault(state, mapped, how))
    return state


def place_and_prefault(state: HostState, buffer: HostBuffer, how: HostOptions) -> None:
    """Steps 3 and 4: the node first, while no page exists."""
    state.numa = place(buffer.address, buffer.nbytes, requested=how.numa_node, gpu_index=how.gpu)
    buffer.prefault(how.threads, how.progress)


def share(
    name: str, nbytes: int, how: HostOptions, *, in_ram: int,
    memory: Callable[[], HostMemory], allocate_devices: Callable[[], Devices],
) -> tuple[HostState, Devices]:
    """Step 5: create or attach the shared pool `name` of `nbytes`, and allocate the device
    pools meanwhile with `allocate_devices`. Whether this process counts the pool against its
    RAM depends on whether it creates it, which only the lock tells: so the RAM figure is
    `memory()` read then, and the device pools (`in_ram` bytes of them in host RAM) come
    after that check."""
    with claim(name, lock_timeout_s=how.lock_timeout_s) as held:
        creating = held.existing is None
        counted = nbytes if creating else 0
        what = f"the shared host pool {name!r}" + (" (created here)" if creating else
                                                   " (attached: counted where created)")
        if in_ram:
            what += " and the CPU device pool"
        check_host_fits(counted + in_ram, memory(), what=what)
        if creating:
            check_free_space(nbytes)
        devices = allocate_devices()
        segment = held.create(nbytes) if creating else held.attach(nbytes)
        state = HostState(HostBuffer(nbytes, huge_pages=how.huge_pages, segment=segment),
                          segment=segment, ram_counted=counted)
        if creating:
            # Under the guard: no other process touches a page before it is placed.
            guarded(state, lambda buffer: place_and_prefault(state, buffer, how),
                    keep_segment=True)
    if not creating:
        def attach(buffer: HostBuffer) -> None:
            buffer.prefault(how.threads, how.progress)
            state.numa = attached_placement(buffer.address, how.numa_node)

        guarded(state, attach)
    return state, devices


def register(
    state: HostState, registrar: Registrar, chunks: Sequence[Chunk], how: HostOptions
) -> None:
    """Step 6: pin the pool with `registrar`, chunk by chunk, all or nothing."""

    def step(buffer: HostBuffer) -> None:
        state.check_size("registering it with CUDA")
        # Held by the state before the first call, so an undo sees every chunk it registers.
        registration = state.registration = Registration(buffer.address, registrar)
        registration.register(chunks, threads=max(1, how.threads), progress=how.progress)

    guarded(state, step)


def guarded(state: HostState, step: Callable[[HostBuffer], None], *,
            keep_segment: bool = False) -> None:
    """Run one step on the pool's mapping; on any exception or interrupt undo the pool (unless
    some chunk may still be registered) and re-raise. `keep_segment` leaves the shared pool's
    hold to the enclosing claim, which lets go of it under its guard."""
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
