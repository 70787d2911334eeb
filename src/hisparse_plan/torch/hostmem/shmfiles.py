"""The shared pool's files as a trust boundary: /dev/shm is writable by every user, so a name
may already be taken by someone else, or be a symbolic link planted to redirect this process.

Every open refuses a symbolic link (O_NOFOLLOW, even as root) and then checks the descriptor
it got, never the path beforehand (the path may change between a check and an open): a regular
file, owned by this process's effective uid, with no group or other permission bits and one
link, and for a pool exactly the planned size. A pool file that fails any of these may be
another user's bait (attached, the KV cache, other users' prompts, would be theirs to read), so
it is refused, never attached, and never removed: its owner or root decides.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from hisparse_plan.torch.errors import BackendError

_FLAGS = os.O_NOFOLLOW | os.O_CLOEXEC
_TAKEN = frozenset({errno.ELOOP, errno.EACCES, errno.EPERM, errno.EISDIR, errno.ENXIO,
                    errno.ETXTBSY})
"""What open() answers for a name taken by something this process must not use."""


def open_checked(name: str, path: Path, flags: int, *, create: bool = False) -> int:
    """A descriptor of the file at `path` that passed `check_owned`; `create` makes it if
    missing (mode 0600). FileNotFoundError when it is missing and not to be created."""
    mode_flags = flags | _FLAGS | (os.O_CREAT if create else 0)
    try:
        fd = os.open(path, mode_flags, 0o600)
    except OSError as error:
        # A link, a directory, or a file this user may not open: a name someone else took.
        # Denied with nothing there, it is the directory that is not writable (the caller
        # says so).
        if error.errno in _TAKEN and os.path.lexists(path):
            problem = describe_path(path)
            raise refusal(name, path, problem or f"cannot be opened by this process (uid "
                          f"{os.geteuid()}): {error.strerror}") from error
        raise
    try:
        check_owned(name, path, fd)
    except BaseException:
        os.close(fd)
        raise
    return fd


def create_exclusive(name: str, path: Path) -> int:
    """A new pool file, mode 0600, made by this call (O_EXCL): never one that was there."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | _FLAGS, 0o600)
    except FileExistsError as error:
        problem = describe_path(path)
        raise refusal(name, path, "appeared while this process held the lock, made by a "
                      "process that does not take it" + (f"; it {problem}" if problem else "")
                      ) from error
    try:
        check_owned(name, path, fd)
    except BaseException:
        os.close(fd)
        unlink_if_same(path, fd)
        raise
    return fd


def check_owned(name: str, path: Path, fd: int) -> None:
    """The open file is a regular file of this process's uid that no one else can open."""
    info = os.fstat(fd)
    problem = _problem(info)
    if problem is not None:
        raise refusal(name, path, problem)


def check_size(name: str, path: Path, fd: int, nbytes: int, *, doing: str) -> None:
    """The pool file still has exactly `nbytes`: a file shrunk under a mapping kills the
    process that touches a page past its end (SIGBUS), so this is asked before each step that
    maps or touches it."""
    size = os.fstat(fd).st_size
    if size != nbytes:
        raise BackendError(
            f"shared host pool {name!r}: {path} has {size} bytes, but it was made with "
            f"{nbytes}; expected it unchanged before {doing}. Another process of this user "
            "resized it; touching a page past its end would kill this process (SIGBUS)"
        )


def same_file(fd: int, other: int) -> bool:
    first, second = os.fstat(fd), os.fstat(other)
    return (first.st_dev, first.st_ino) == (second.st_dev, second.st_ino)


def unlink_if_same(path: Path, fd: int) -> bool:
    """Remove `path` only if it still names the file open as `fd` (not a file someone put
    there meanwhile, and never what a symbolic link points to)."""
    try:
        current = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    if (current.st_dev, current.st_ino) != (held.st_dev, held.st_ino):
        return False
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True


def describe_path(path: Path) -> str | None:
    """What is wrong with what is at `path`, for a message only (the decision is made on a
    descriptor); None when nothing shows."""
    try:
        info = os.stat(path, follow_symlinks=False)
    except OSError as error:
        return f"cannot be opened ({error.strerror})"
    if stat.S_ISLNK(info.st_mode):
        return (f"is a symbolic link (owner uid {info.st_uid}) to {os.readlink(path)!r}; "
                "a shared pool's files are never followed through links")
    return _problem(info)


def refusal(name: str, path: Path, problem: str) -> BackendError:
    return BackendError(
        f"shared host pool {name!r}: {path} {problem}; refusing it, since another user may "
        "have made it to read the pool (the KV cache of other users' prompts) or to redirect "
        "this process's writes. Expected a regular file of this user, mode 0600, or none: "
        "have its owner (or root) remove it, or pick another host_pool_name"
    )


def _problem(info: os.stat_result) -> str | None:
    mode = stat.S_IMODE(info.st_mode)
    if not stat.S_ISREG(info.st_mode):
        return f"is not a regular file (mode {stat.filemode(info.st_mode)})"
    if info.st_uid != os.geteuid():
        return (f"belongs to uid {info.st_uid} (mode {mode:04o}), not to this process's uid "
                f"{os.geteuid()}")
    if mode & 0o077:
        return f"has mode {mode:04o}; expected 0600 (no group or other access)"
    if info.st_nlink != 1:
        return f"has {info.st_nlink} hard links; expected 1"
    return None
