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

/dev/shm is every user's: both files are opened as a trust boundary (module `shmfiles`: no
symbolic links, this user's regular files of mode 0600 only, the pool of exactly its size), a
name another user took is refused saying so and left alone, the lock is waited for at most
`lock_timeout_s` (module `locks`), and a call that fails leaves no file it made.
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
from hisparse_plan.torch.hostmem.locks import (
    DEFAULT_LOCK_TIMEOUT_S,
    check_timeout,
    deadline_after,
    flock_within,
    note_holder,
)
from hisparse_plan.torch.hostmem.ram import gib
from hisparse_plan.torch.hostmem.shmfiles import (
    check_size,
    create_exclusive,
    open_checked,
    refusal,
    same_file,
    unlink_if_same,
)
from hisparse_plan.torch.hostmem.tasks import LOG

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
    lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S

    def info(self) -> SharedPool:
        return SharedPool(self.name, self.path, self.nbytes, self.created)

    def check_size(self, doing: str) -> None:
        """Raise if the pool file no longer has its size (another process shrank it): asked
        before each step that maps or touches it, so that this is an error, not a SIGBUS."""
        if self.fd is not None:
            check_size(self.name, self.path, self.fd, self.nbytes, doing=doing)

    def open_for_mapping(self) -> int:
        """A descriptor of the pool file of its own (an mmap keeps one open, and it must not
        be the one holding the flock), proven to be the very file this rank holds, at its
        size. The caller closes it."""
        if self.fd is None:
            raise BackendError(f"shared host pool {self.name!r} was let go of; allocate again")
        with _os_errors(self.name, "reopening"):
            fd = open_checked(self.name, self.path, os.O_RDWR)
        try:
            if not same_file(fd, self.fd):
                raise refusal(self.name, self.path, "is no longer the file this process holds")
            self.check_size("mapping it")
        except BaseException:
            os.close(fd)
            raise
        return fd

    def close(self) -> bool:
        """Let go of the pool; the last rank to do so removes its files. True if removed. A
        lock that stays held past `lock_timeout_s` still lets go of this rank's hold (the
        files are then left for the next start, which removes an unheld pool) and raises."""
        if self.fd is None:
            return False
        try:
            with _os_errors(self.name, "locking"):
                guard = _lock_exclusive(self.name, self.lock, self.lock_timeout_s)
        except BaseException:
            fd, self.fd = self.fd, None
            os.close(fd)
            raise
        try:
            with _os_errors(self.name, "closing"):
                return self._drop(guard)
        finally:
            os.close(guard)

    def _drop(self, guard: int) -> bool:
        """Close this rank's hold and remove the files if no rank holds the pool any more;
        the caller holds the guard, open as `guard`."""
        fd, self.fd = self.fd, None
        if fd is None:
            return False
        os.close(fd)  # drops the shared flock
        removed = _remove_if_unheld(self.name, self.path, self.lock, guard)
        LOG.debug("shared host pool %r: closed by this process%s", self.name,
                  "; no process holds it any more, removed " + str(self.path) if removed else "")
        return removed


class Claim:
    """The guard of one shared pool name, held: says whether a live pool exists, and creates
    or attaches it. Use through `claim`."""

    def __init__(self, name: str, directory: Path | None, guard: int,
                 lock_timeout_s: float) -> None:
        self.name = name
        self.path = pool_path(name, directory)
        self.lock = lock_path(name, directory)
        self.guard = guard
        self.lock_timeout_s = lock_timeout_s
        self.existing: int | None = None
        """The size of the live pool this rank would attach, None when it must create one."""
        self.segment: SharedSegment | None = None
        self._live: int | None = None
        """The live pool's file, open and checked: `attach` holds this very file."""

    def _inspect(self) -> None:
        try:
            fd = open_checked(self.name, self.path, os.O_RDWR)
        except FileNotFoundError:
            return
        live = False
        try:
            size = os.fstat(fd).st_size
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                live = True
                self.existing, self._live = size, fd
                return
            LOG.warning(
                "shared host pool %r: %s (%s) is held by no process: it was left by one that "
                "exited without closing it (killed or crashed); removing it and creating the "
                "pool afresh", self.name, self.path, gib(size),
            )
            unlink_if_same(self.path, fd)
        finally:
            if not live:
                os.close(fd)

    def create(self, nbytes: int) -> SharedSegment:
        """Create the pool file, sized `nbytes` (sparse until prefaulted), and hold it."""
        if self.existing is not None:
            raise BackendError(f"shared host pool {self.name!r} exists; attach it instead")
        with _os_errors(self.name, "creating"):
            fd = create_exclusive(self.name, self.path)
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                os.ftruncate(fd, nbytes)
                check_size(self.name, self.path, fd, nbytes, doing="mapping it")
            except BaseException:
                unlink_if_same(self.path, fd)
                os.close(fd)
                raise
        self.segment = SharedSegment(self.name, self.path, self.lock, nbytes, True, fd,
                                     self.lock_timeout_s)
        LOG.debug("shared host pool %r: created %s (%s)", self.name, self.path, gib(nbytes))
        return self.segment

    def attach(self, nbytes: int) -> SharedSegment:
        """Hold the live pool, after checking it has exactly `nbytes`."""
        if self.existing is None or self._live is None:
            raise BackendError(f"shared host pool {self.name!r} does not exist; create it")
        if self.existing != nbytes:
            raise BackendError(
                f"shared host pool {self.name!r} ({self.path}) has {self.existing} bytes, but "
                f"this plan's pool has {nbytes}; expected every rank to allocate the same plan "
                "(or a different host_pool_name for a different plan)"
            )
        fd, self._live = self._live, None
        try:
            check_size(self.name, self.path, fd, nbytes, doing="attaching it")
            with _os_errors(self.name, "attaching"):
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BaseException:
            os.close(fd)
            raise
        self.segment = SharedSegment(self.name, self.path, self.lock, nbytes, False, fd,
                                     self.lock_timeout_s)
        LOG.debug("shared host pool %r: attached %s (%s)", self.name, self.path, gib(nbytes))
        return self.segment

    def abandon(self) -> None:
        """Undo `create`/`attach` after a failure, under the guard still held."""
        if self.segment is not None:
            self.segment._drop(self.guard)
            self.segment = None

    def _forget_live(self) -> None:
        fd, self._live = self._live, None
        if fd is not None:
            os.close(fd)


@contextlib.contextmanager
def claim(
    name: str, directory: Path | None = None, *,
    lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
) -> Iterator[Claim]:
    """Hold the guard of pool `name` and say what exists: the block runs alone among every
    process using that name. Leaving it leaves the guard; an unheld pool file left by a dead
    process has been removed by then, and so has any file this call made, if it holds no
    pool."""
    check_name(name)
    check_timeout(lock_timeout_s)
    with _os_errors(name, "locking"):
        guard = _lock_exclusive(name, lock_path(name, directory), lock_timeout_s)
    held = Claim(name, directory, guard, lock_timeout_s)
    try:
        try:
            with _os_errors(name, "opening"):
                held._inspect()
            yield held
        except BaseException:
            held.abandon()
            raise
        finally:
            held._forget_live()
            if held.segment is None:  # nothing made or held: leave no lock file behind
                with contextlib.suppress(OSError):
                    _remove_if_unheld(name, held.path, held.lock, guard)
    finally:
        os.close(guard)


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


def _lock_exclusive(name: str, path: Path, timeout_s: float) -> int:
    """An exclusive flock on the lock file at `path`, the file that is at `path` right now
    (a lock file removed while this process waited would guard nothing), within
    `timeout_s` seconds. The holder notes its pid in it, for whoever waits."""
    deadline = deadline_after(timeout_s)
    while True:
        fd = open_checked(name, path, os.O_RDWR, create=True)
        try:
            flock_within(fd, fcntl.LOCK_EX, deadline, timeout_s,
                         what=f"the lock {path} of shared host pool {name!r}")
            current = os.stat(path, follow_symlinks=False)
        except FileNotFoundError:
            os.close(fd)
            continue
        except BaseException:
            os.close(fd)
            raise
        held = os.fstat(fd)
        if (held.st_dev, held.st_ino) == (current.st_dev, current.st_ino) and stat.S_ISREG(
            current.st_mode
        ):
            note_holder(fd)
            return fd
        os.close(fd)


def _remove_if_unheld(name: str, path: Path, lock: Path, guard: int) -> bool:
    """Remove the pool file if no process holds it, and then the lock file (open as `guard`);
    a pool file that is not this user's is left alone (its owner decides), its lock not."""
    try:
        fd = open_checked(name, path, os.O_RDWR)
    except (FileNotFoundError, BackendError):  # gone, or not ours: only our lock file goes
        unlink_if_same(lock, guard)
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return False
    # Unlinked while the guard is held: a rank waiting on the lock file retries on the next.
    # Someone may have removed either file by hand meanwhile; what is gone is gone.
    try:
        unlink_if_same(path, fd)
    finally:
        os.close(fd)
    unlink_if_same(lock, guard)
    return True
