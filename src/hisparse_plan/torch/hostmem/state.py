"""What one host pool holds while it lives, and the undo that never unmaps memory the driver
may still reach.

Down is the reverse of up (module `lifecycle`): unregister every chunk, and only once none is
left registered, unmap, then let go of a shared pool. A chunk that cannot be unregistered keeps
its buffer mapped for the life of the process (see `STRANDED`): a leak is recoverable, a DMA
engine writing into reused memory is not.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from hisparse_plan.torch.errors import BackendError, RegistrationError
from hisparse_plan.torch.hostmem.mapping import HostBuffer, MetaHostBuffer
from hisparse_plan.torch.hostmem.numa import NumaPlacement
from hisparse_plan.torch.hostmem.ram import gib
from hisparse_plan.torch.hostmem.registration import Registration
from hisparse_plan.torch.hostmem.shm import SharedPool, SharedSegment
from hisparse_plan.torch.hostmem.tasks import LOG

_cuda_initialized: Callable[[], bool] = torch.cuda.is_initialized

STRANDED: list[tuple[HostBuffer | MetaHostBuffer | None, SharedSegment | None]] = []
"""Buffers (and shared-pool holds) some of whose chunks failed to unregister: referenced here
so that nothing ever unmaps them while this process lives."""


@dataclass
class HostState:
    """What must be undone for the host pool, in order: unregister, unmap, let go of the
    shared pool. `ram_counted` is what this process counted of it against host RAM."""

    buffer: HostBuffer | MetaHostBuffer | None
    segment: SharedSegment | None = None
    numa: NumaPlacement | None = None
    ram_counted: int = 0
    registration: Registration | None = None

    @property
    def shared(self) -> SharedPool | None:
        return None if self.segment is None else self.segment.info()

    def check_size(self, doing: str) -> None:
        """A shared pool's file still has its size (see `SharedSegment.check_size`)."""
        if self.segment is not None:
            self.segment.check_size(doing)

    def abort(self) -> None:
        """Undo a failed allocation (no view was handed out): unmap at once, unless some
        chunk may still be registered."""
        if self.registration is not None and not self.registration.clean:
            self._strand("allocation failed")
            return
        if isinstance(self.buffer, HostBuffer):
            self.buffer.unmap()
        self.buffer = None
        self._let_go()

    def close(self) -> None:
        """Unregister, then release the pages and let go of a shared pool. An interrupt
        during unregistering still releases (once nothing is left registered) and is raised
        afterwards; a chunk that failed to unregister strands the buffer instead."""
        interrupted: BaseException | None = None
        if self.registration is not None:
            if torch.cuda.is_available() and _cuda_initialized():
                # A copy still reading the pool must finish before its pages unpin.
                torch.cuda.synchronize()
            registration, self.registration = self.registration, None
            try:
                registration.unregister()
            except BaseException as error:
                if not registration.clean:
                    self._strand("closing failed")
                    raise
                interrupted = error
        if self.buffer is not None:
            self.buffer.release()
            self.buffer = None
        self._let_go()
        if interrupted is not None:
            raise interrupted

    def _let_go(self) -> None:
        segment, self.segment = self.segment, None
        if segment is not None:
            segment.close()

    def _strand(self, when: str) -> None:
        STRANDED.append((self.buffer, self.segment))
        LOG.error("%s with host pool chunks possibly still registered: keeping the %s mapping "
                  "for the life of this process", when,
                  "?" if self.buffer is None else gib(self.buffer.nbytes))
        self.buffer, self.segment = None, None


def describe(state: HostState, registered: int) -> str:
    """One line on the host pool for the allocation summary."""
    buffer = state.buffer
    if buffer is None:
        return "host pool: none"
    if isinstance(buffer, MetaHostBuffer):
        return f"host pool: {gib(buffer.nbytes)} on the meta device (no memory)"
    shared = state.shared
    if shared is None:
        kind = "private mapping"
    else:
        whose = ("created by this process, counted against its host RAM" if shared.created
                 else "attached, counted by the process that created it")
        kind = f"shared {shared.name!r} ({shared.path}, {whose})"
    pinned = f"pinned in {registered} chunk(s)" if registered else "pageable"
    numa = "" if state.numa is None else f"; {state.numa.describe()}"
    return f"host pool: {gib(buffer.nbytes)}, {kind}, {pinned}{numa}"


def suppress_close_errors(state: HostState) -> None:
    """Garbage collection or interpreter exit: a failure here has no caller to tell."""
    with contextlib.suppress(BackendError, RegistrationError, RuntimeError, OSError):
        state.close()


def close_all(states: Iterable[HostState], *, quiet: bool = True) -> None:
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
