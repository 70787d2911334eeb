"""A host pool in named shared memory, one copy for every tensor-parallel rank of a node.

The pool is a file in /dev/shm (tmpfs), `hisparse_plan-<name>.pool`, that every rank maps with
MAP_SHARED. Its lifetime is counted with locks the kernel releases by itself when a process
dies, so a crash can never leave a count that is wrong:

* every rank that uses the pool holds a shared flock on the pool file for as long as it does;
* creating, attaching and closing happen under an exclusive flock on `hisparse_plan-<name>.lock`,
  so one rank at a time decides. The first creates the file (sized, placed and prefaulted before
  the guard is let go, so no rank sees a half-built pool); the others attach, after checking
  the size;
* a rank that closes drops its shared lock, then tries an exclusive one without waiting: if it
  gets it, no rank holds the pool any more, and it removes both files.

A pool file that nobody holds when a rank starts was left by a process that died (SIGKILL, a
crash, a power cut of the job) without closing; it is removed with a WARNING and the pool is
created afresh, so a dead creator never blocks a restart. Lock files are removed too; a rank
that waited on a lock file that was removed meanwhile notices (its inode is gone) and retries.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from hisparse_plan.torch.errors import BackendError, HostMemoryError
from hisparse_plan.torch.hostmem import gib
from hisparse_plan.torch.tasks import LOG

SHM_DIR = Path("/dev/shm")  # noqa: S108 - the named shared memory every rank can open
"""Where the pool files live; read at call time, so tests may point it elsewhere."""

PREFIX = "hisparse_plan-"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def check_name(name: str) -> None:
    if not _NAME.fullmatch(name):
        raise BackendError(
            f"host_pool_name is {name!r}; expected 1 to 128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit (it names a file in /dev/shm)"
        )


def pool_path(name: str, directory: Path | None = None) -> Path:
    return (SHM_DIR if directory is None else directory) / f"{PREFIX}{name}.pool"


def lock_path(name: str, directory: Path | None = None) -> Path:
    return (SHM_DIR if directory is None else directory) / f"{PREFIX}{name}.lock"


def check_free_space(nbytes: int, directory: Path | None = None) -> None:
    """Refuse a pool the shared-memory file system cannot hold (a container's /dev/shm is
    often 64 MiB): touching a page past its limit would kill the process with SIGBUS."""
    where = SHM_DIR if directory is None else directory
    with _os_errors(str(where), "checking the free space of"):
        info = os.statvfs(where)
    free = info.f_bavail * info.f_frsize
    if nbytes > free:
        raise HostMemoryError(
            f"the shared host pool needs {gib(nbytes)}, but {where} has only {gib(free)} "
            f"free; expected at least the pool's size there. Enlarge {where} (for a "
            "container, --shm-size) or lower hisparse.host_pool_gib",
            requested=nbytes, available=free,
        )


@dataclass(frozen=True, slots=True)
class SharedPool:
    """What a rank knows of the shared pool it maps: `created` is True in the rank that made
    it (and counted it against host RAM), False in the ranks that attached it."""

    name: str
    path: Path
    nbytes: int
    created: bool


@dataclass
class SharedSegment:
    """One rank's hold on a shared pool: `fd` is the pool file, under a shared flock."""

    name: str
    path: Path
    lock: Path
    nbytes: int
    created: bool
    fd: int | None

    def info(self) -> SharedPool:
        return SharedPool(self.name, self.path, self.nbytes, self.created)

    def close(self) -> bool:
        """Let go of the pool; the last rank to do so removes its files. True if removed."""
        if self.fd is None:
            return False
        with _os_errors(self.name, "closing"), _guard(self.lock):
            return self._drop()

    def _drop(self) -> bool:
        """Close this rank's hold and remove the files if no rank holds the pool any more;
        the caller holds the guard."""
        fd, self.fd = self.fd, None
        if fd is None:
            return False
        os.close(fd)  # drops the shared flock
        removed = _remove_if_unheld(self.path, self.lock)
        LOG.debug("shared host pool %r: closed by this process%s", self.name,
                  "; no process holds it any more, removed " + str(self.path) if removed else "")
        return removed


class Claim:
    """The guard of one shared pool name, held: says whether a live pool exists, and creates
    or attaches it. Use through `claim`."""

    def __init__(self, name: str, directory: Path | None) -> None:
        self.name = name
        self.path = pool_path(name, directory)
        self.lock = lock_path(name, directory)
        self.existing: int | None = None
        """The size of the live pool this rank would attach, None when it must create one."""
        self.segment: SharedSegment | None = None

    def _inspect(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        try:
            size = os.fstat(fd).st_size
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self.existing = size
                return
        finally:
            os.close(fd)
        LOG.warning(
            "shared host pool %r: %s (%s) is held by no process: it was left by one that "
            "exited without closing it (killed or crashed); removing it and creating the pool "
            "afresh", self.name, self.path, gib(size),
        )
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def create(self, nbytes: int) -> SharedSegment:
        """Create the pool file, sized `nbytes` (sparse until prefaulted), and hold it."""
        if self.existing is not None:
            raise BackendError(f"shared host pool {self.name!r} exists; attach it instead")
        with _os_errors(self.name, "creating"):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_SH)
                os.ftruncate(fd, nbytes)
            except BaseException:
                os.close(fd)
                self.path.unlink()
                raise
        self.segment = SharedSegment(self.name, self.path, self.lock, nbytes, True, fd)
        LOG.debug("shared host pool %r: created %s (%s)", self.name, self.path, gib(nbytes))
        return self.segment

    def attach(self, nbytes: int) -> SharedSegment:
        """Hold the live pool, after checking it has exactly `nbytes`."""
        if self.existing is None:
            raise BackendError(f"shared host pool {self.name!r} does not exist; create it")
        if self.existing != nbytes:
            raise BackendError(
                f"shared host pool {self.name!r} ({self.path}) has {self.existing} bytes, but "
                f"this plan's pool has {nbytes}; expected every rank to allocate the same plan "
                "(or a different host_pool_name for a different plan)"
            )
        with _os_errors(self.name, "attaching"):
            fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
            fcntl.flock(fd, fcntl.LOCK_SH)
        self.segment = SharedSegment(self.name, self.path, self.lock, nbytes, False, fd)
        LOG.debug("shared host pool %r: attached %s (%s)", self.name, self.path, gib(nbytes))
        return self.segment

    def abandon(self) -> None:
        """Undo `create`/`attach` after a failure, under the guard still held."""
        if self.segment is not None:
            self.segment._drop()
            self.segment = None


@contextlib.contextmanager
def claim(name: str, directory: Path | None = None) -> Iterator[Claim]:
    """Hold the guard of pool `name` and say what exists: the block runs alone among every
    process using that name. Leaving it leaves the guard; an unheld pool file left by a dead
    process has been removed by then."""
    check_name(name)
    held = Claim(name, directory)
    with _os_errors(name, "locking"):
        fd = _lock_exclusive(held.lock)
    try:
        with _os_errors(name, "opening"):
            held._inspect()
        try:
            yield held
        except BaseException:
            held.abandon()
            raise
        finally:
            if held.segment is None:  # nothing made or held: leave no lock file behind
                _remove_if_unheld(held.path, held.lock)
    finally:
        os.close(fd)


@contextlib.contextmanager
def _os_errors(name: str, doing: str) -> Iterator[None]:
    """A file-system failure of the shared pool's own files, as a BackendError naming it."""
    try:
        yield
    except OSError as error:
        raise BackendError(
            f"shared host pool {name!r}: {doing} {error.filename or SHM_DIR} failed: "
            f"{error.strerror or error}; expected a writable {SHM_DIR} that every rank (the "
            "same user) can open"
        ) from error


@contextlib.contextmanager
def _guard(path: Path) -> Iterator[None]:
    fd = _lock_exclusive(path)
    try:
        yield
    finally:
        os.close(fd)


def _lock_exclusive(path: Path) -> int:
    """An exclusive flock on the lock file at `path`, the file that is at `path` right now
    (a lock file removed while this process waited would guard nothing)."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            current = os.stat(path)
        except FileNotFoundError:
            os.close(fd)
            continue
        except BaseException:
            os.close(fd)
            raise
        if os.fstat(fd).st_ino == current.st_ino and stat.S_ISREG(current.st_mode):
            return fd
        os.close(fd)


def _remove_if_unheld(path: Path, lock: Path) -> bool:
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:  # removed already: only the lock file is left to go
        with contextlib.suppress(FileNotFoundError):
            lock.unlink()
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    # Unlinked while the guard is held: a rank waiting on the lock file retries on the next.
    # Someone may have removed either file by hand meanwhile; what is gone is gone.
    for unheld in (path, lock):
        with contextlib.suppress(FileNotFoundError):
            unheld.unlink()
    return True
