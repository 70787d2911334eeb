"""The host pool's lifetime: its size, its mapping (private or shared), NUMA placement,
prefault, registration, and an undo that never unmaps memory the driver may still reach.

Order matters both ways. Up: map, bind to a NUMA node (before any page exists), prefault,
register. Down: unregister every chunk, and only once none is left registered, unmap. A chunk
that cannot be unregistered keeps its buffer mapped for the life of the process (see
`STRANDED`): a leak is recoverable, a DMA engine writing into reused memory is not.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from hisparse_plan.models import KVCachePlan
from hisparse_plan.rules.arith import round_up
from hisparse_plan.torch.errors import BackendError, RegistrationError
from hisparse_plan.torch.hostmem.mapping import OS_PAGE, HostBuffer, MetaHostBuffer
from hisparse_plan.torch.hostmem.numa import NumaPlacement, memory_policy, page_node
from hisparse_plan.torch.hostmem.ram import gib
from hisparse_plan.torch.hostmem.registration import Registration
from hisparse_plan.torch.hostmem.shm import SharedPool, SharedSegment
from hisparse_plan.torch.hostmem.tasks import LOG
from hisparse_plan.torch.vllm.binding import check_fits
from hisparse_plan.views import plan_views

_cuda_initialized: Callable[[], bool] = torch.cuda.is_initialized

STRANDED: list[tuple[HostBuffer | MetaHostBuffer | None, SharedSegment | None]] = []
"""Buffers (and shared-pool holds) some of whose chunks failed to unregister: referenced here
so that nothing ever unmaps them while this process lives."""


def host_pool_bytes(plan: KVCachePlan) -> int:
    """The host pool mapping's size: max(host_pool.size, block_stride * num_blocks), and for a
    shared pool that rounded up to the OS page.

    The plan's host tensors stride by `bytes_per_block` (the source page) and span
    `host_pool.size`; `host_pool.block_stride` is that page rounded up to 4096 bytes when the
    pool is shared, so that a rank addressing blocks by the pool's own stride stays inside the
    mapping too. The larger of the two therefore serves both readings, and equals `size` for a
    private pool (where the two strides agree), so nothing changes there. A shared pool is a
    file every rank maps whole, hence whole OS pages, identical in every rank. Every host view
    must fit the result; one that does not is refused (`check_host_views`) rather than given a
    bigger pool, since a view past the planned pool means the plan is wrong.
    """
    pool = plan.host_pool
    if pool is None:
        raise BackendError("the plan has no host_pool; expected one to size")
    needed = max(pool.size, pool.block_stride * pool.num_blocks)
    return round_up(needed, OS_PAGE) if pool.shared else needed


def check_host_views(plan: KVCachePlan, nbytes: int) -> None:
    """Every host layer view inside a pool of `nbytes`, before any memory is touched."""
    for view in plan_views(plan).values():
        if view.host_resident:
            check_fits(view, nbytes)


def check_shared(plan: KVCachePlan, name: str | None, device: torch.device) -> None:
    """`host_pool_name` only for a plan whose host pool is shared, on real memory."""
    if name is None:
        return
    if plan.host_pool is None:
        raise BackendError(
            f"host_pool_name={name!r} was given, but the plan has no host_pool to share"
        )
    if not plan.host_pool.shared:
        raise BackendError(
            f"host_pool_name={name!r} asks for a shared host pool, but the plan's "
            "host_pool.shared is false; plan with hisparse.shared_host_pool = true (its "
            "blocks are then page-aligned for the shared mapping), or drop host_pool_name"
        )
    if device.type == "meta":
        raise BackendError(
            f"host_pool_name={name!r} with device='meta': meta pools hold no memory to share"
        )


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


def attached_placement(address: int, requested: int | None) -> NumaPlacement:
    """Where the creating process put a shared pool this process attached (its policy and the
    node of its first page); a node asked for explicitly must be that one."""
    node = page_node(address)
    if requested is not None and node != requested:
        raise BackendError(
            f"numa_node={requested} was asked for, but the shared host pool this process "
            f"attached lives on node {'unknown' if node is None else node}, where the process "
            "that created it placed it; ask every rank for the same node"
        )
    if node is None:
        return NumaPlacement(None, None, "attached a shared pool; its node cannot be read")
    policy = memory_policy(address)
    if policy is None or policy[0] == "MPOL_DEFAULT":
        return NumaPlacement(node, None, "where the kernel put the pages: the process that "
                                         "created the shared pool bound nothing")
    return NumaPlacement(node, policy[0], "set by the process that created the shared pool")


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
