"""The host pool's memory: one page-aligned mapping of exactly the planned bytes, prefaulted.

Why not `torch.empty(..., pin_memory=True)`: torch's pinned allocator rounds every request up to
a power of two, so a 300 GiB pool reserves 512 GiB. Why not plain `torch.empty`: the CPU
allocator aligns to 64 bytes, not to an OS page, and CUDA registration and huge pages both want
page-aligned memory. An anonymous private mapping is page-aligned, sized to the byte (the kernel
rounds only to the next OS page), and can be asked for transparent huge pages. A shared host
pool is the same thing over a /dev/shm file mapped MAP_SHARED (module `shm` owns the file).

Prefaulting commits every page now, so a pool the machine cannot back fails at start-up rather
than in the OOM killer hours later, and so that pinning finds the pages already present. It runs
on several threads through madvise(MADV_POPULATE_WRITE) (Linux 5.14+), which faults pages
in-kernel; where that is missing it writes one byte per OS page (after reserving a shared
pool's file, so that a full /dev/shm is an error and not a SIGBUS).
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import sys
from collections.abc import Callable

import torch

from hisparse_plan.torch.errors import BackendError, HostMemoryError
from hisparse_plan.torch.hostmem.ram import gib
from hisparse_plan.torch.hostmem.shm import SharedSegment
from hisparse_plan.torch.hostmem.tasks import LOG, Progress, run_tasks

OS_PAGE = mmap.PAGESIZE
HOST_ALIGNMENT = 4096
"""Engines and CUDA registration expect the pool to start on a 4 KiB boundary at least."""

PREFAULT_TASK_PAGES = 16384
"""OS pages per prefault task. Small enough that tasks spread over threads and one failure
names a narrow range; below torch's parallel grain, so a fallback fill stays on its thread."""

_MADV_POPULATE_WRITE = 23
"""Linux's value; not exported by Python's mmap module before 3.13."""


def default_prefault_threads() -> int:
    """Up to 8 threads: page faulting stops scaling well before that on most hosts."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(8, cpus))


class HostBuffer:
    """A page-aligned mapping of `nbytes`, exposed as a flat uint8 tensor: anonymous and
    private, or with `segment` the shared mapping of that pool file (a shared host pool).

    The tensor holds a reference to the mapping, so the memory stays mapped while any view of
    it lives, and is unmapped when the last one goes. `release` returns the physical pages at
    once even if stray views remain (they would read zeros, never freed memory). `unmap` is
    for failures before any view was handed out: it unmaps at once.
    """

    def __init__(
        self, nbytes: int, *, huge_pages: bool = True, segment: SharedSegment | None = None
    ) -> None:
        if nbytes < 1:
            raise BackendError(f"the host pool must have at least 1 byte; got {nbytes}")
        self.shared = segment is not None
        self._segment = segment
        try:
            self._map: mmap.mmap | None = _map(nbytes, segment)
        except OSError as error:
            raise HostMemoryError(
                f"mapping the host pool of {gib(nbytes)} failed: {error}",
                requested=nbytes, available=0,
            ) from error
        if huge_pages and hasattr(mmap, "MADV_HUGEPAGE"):
            # Huge pages make prefaulting several times faster and spare the TLB; a kernel
            # with them disabled ignores the advice.
            self._map.madvise(mmap.MADV_HUGEPAGE)
        self.nbytes = nbytes
        self.tensor: torch.Tensor | None = torch.frombuffer(
            self._map, dtype=torch.uint8, count=nbytes
        )
        address = self.tensor.data_ptr()
        if address % HOST_ALIGNMENT:
            self.unmap()
            raise BackendError(
                f"the host pool landed at address {address:#x}; expected a multiple of "
                f"{HOST_ALIGNMENT}"
            )
        self.address = address
        LOG.debug("mapped the host pool: %s at %#x (%s)", gib(nbytes), address,
                  "shared" if self.shared else "private anonymous")

    def prefault(self, threads: int, progress: Progress | None = None) -> None:
        """Commit every page, `threads` at a time; 0 leaves pages to fault on first use."""
        if threads <= 0 or self.tensor is None:
            return
        span = PREFAULT_TASK_PAGES * OS_PAGE
        starts = range(0, self.nbytes, span)
        if self._segment is not None:
            self._segment.check_size("prefaulting it")
        populate = _populate_supported(self.address)
        if not populate and self._segment is not None:
            # Touching a shared page the tmpfs cannot back raises SIGBUS and kills the process;
            # fallocate reserves the space first and fails with ENOSPC instead.
            _fallocate(self._segment, self.nbytes)
        touch = _populate if populate else self._touch
        LOG.debug("prefaulting %s on %d thread(s) (%s)", gib(self.nbytes), threads,
                  "MADV_POPULATE_WRITE" if populate else "one write per page")
        run_tasks(starts, lambda start: touch(self, start, min(start + span, self.nbytes)),
                  threads=threads, step="prefault", progress=progress)

    @staticmethod
    def _touch(buffer: HostBuffer, start: int, end: int) -> None:
        if buffer.tensor is not None:
            buffer.tensor[start:end:OS_PAGE].fill_(0)

    def release(self) -> None:
        """Hand this mapping's pages back and drop this buffer's references to it (a shared
        pool's memory stays with the other processes that map it)."""
        if self._map is None:
            return
        if hasattr(mmap, "MADV_DONTNEED"):
            # On a shared mapping this only drops this process's page tables; MADV_REMOVE
            # would free the pages under the other ranks.
            self._map.madvise(mmap.MADV_DONTNEED)
        self.tensor = None
        # Not close(): torch.frombuffer does not pin the mapping's buffer export, so closing
        # would unmap memory under views that still exist. Dropping the reference unmaps it
        # once the last view is gone.
        self._map = None

    def unmap(self) -> None:
        """Unmap now. Only for a buffer whose tensor never left the backend (a failed
        allocation): a view taken from it would point at unmapped memory."""
        mapping, self._map, self.tensor = self._map, None, None
        if mapping is not None:
            mapping.close()
            LOG.debug("unmapped the host pool (%s)", gib(self.nbytes))


class MetaHostBuffer:
    """A host pool on the meta device: its size and views, no memory."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self.tensor: torch.Tensor | None = torch.empty(nbytes, dtype=torch.uint8, device="meta")

    def release(self) -> None:
        self.tensor = None


def _libc_madvise() -> Callable[[int, int, int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    function = libc.madvise
    function.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    function.restype = ctypes.c_int

    def call(address: int, length: int, advice: int) -> int:
        # ctypes drops the GIL for the call, so several threads fault in parallel.
        return 0 if function(address, length, advice) == 0 else ctypes.get_errno()

    return call


_MADVISE = _libc_madvise()


def _populate_supported(address: int) -> bool:
    """Probe MADV_POPULATE_WRITE on the first OS page (older kernels answer EINVAL)."""
    return _MADVISE is not None and _MADVISE(address, OS_PAGE, _MADV_POPULATE_WRITE) == 0


def _populate(buffer: HostBuffer, start: int, end: int) -> None:
    if _MADVISE is None:
        HostBuffer._touch(buffer, start, end)
        return
    code = _MADVISE(buffer.address + start, end - start, _MADV_POPULATE_WRITE)
    if code == 0:
        return
    if code in (errno.ENOMEM, errno.EFAULT):
        raise HostMemoryError(
            f"prefaulting host pool bytes {start}..{end} failed ({os.strerror(code)}): the "
            f"machine could not back the {gib(buffer.nbytes)} pool",
            requested=buffer.nbytes, available=0,
        )
    raise BackendError(f"madvise(MADV_POPULATE_WRITE) on host pool bytes {start}..{end} "
                       f"failed: {os.strerror(code)}")


def _map(nbytes: int, segment: SharedSegment | None) -> mmap.mmap:
    protection = mmap.PROT_READ | mmap.PROT_WRITE
    if segment is None:
        return mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, prot=protection)
    # A descriptor of its own: mmap keeps a duplicate of it for as long as the mapping lives,
    # and that must not be the one holding the shared pool's flock (module shm), or a stray
    # view would keep the pool counted as held. It is checked to be the held file, at its size.
    fd = segment.open_for_mapping()
    try:
        return mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED, prot=protection)
    finally:
        os.close(fd)


def _fallocate(segment: SharedSegment, nbytes: int) -> None:
    fd = segment.open_for_mapping()
    try:
        os.posix_fallocate(fd, 0, nbytes)
    except OSError as error:
        raise HostMemoryError(
            f"reserving the shared host pool of {gib(nbytes)} failed ({error.strerror}): "
            f"{segment.path.parent} cannot hold it",
            requested=nbytes, available=0,
        ) from error
    finally:
        os.close(fd)
