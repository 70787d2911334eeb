"""Waiting for a flock with a deadline, and naming the process that holds it.

A lock held forever (a hung or hostile process) must not hang the engine: the wait polls a
non-blocking flock until the deadline (a blocking flock cannot be given a timeout without
signals, which a library must not take over), then says who holds the lock, as far as the
kernel (/proc/locks) or the holder's own note in the file (its pid) can tell.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from hisparse_plan.torch.errors import BackendError

DEFAULT_LOCK_TIMEOUT_S = 300.0
"""Long enough for the rank that creates a large pool to prefault it under the lock (about a
minute for 300 GiB), short enough that a hung holder stops the engine with an error."""

PROC_LOCKS = Path("/proc/locks")

_FIRST_POLL_S = 0.001
_LONGEST_POLL_S = 0.05


class LockTimeoutError(BackendError):
    """A lock of the shared host pool was not free before the deadline. `holder` is the pid
    of the process holding it, None when it cannot be known."""

    def __init__(self, message: str, *, holder: int | None) -> None:
        super().__init__(message)
        self.holder = holder


def check_timeout(timeout_s: float) -> None:
    if not timeout_s > 0:  # also refuses NaN
        raise BackendError(f"lock_timeout_s is {timeout_s}; expected a number of seconds above 0")


def deadline_after(timeout_s: float) -> float:
    return time.monotonic() + timeout_s


def flock_within(fd: int, operation: int, deadline: float, timeout_s: float, *,
                 what: str) -> None:
    """flock(fd, operation) (LOCK_EX or LOCK_SH), waiting until `deadline` (a
    `time.monotonic()` reading, `timeout_s` after the wait began) at the latest."""
    pause = _FIRST_POLL_S
    while True:
        try:
            fcntl.flock(fd, operation | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            time.sleep(min(pause, left))
            pause = min(2 * pause, _LONGEST_POLL_S)
    holder = lock_holder(fd)
    who = "a process this one cannot see" if holder is None else f"pid {holder}{_command(holder)}"
    raise LockTimeoutError(
        f"waited {timeout_s:g} s for {what}, held by {who}; expected it free within "
        "lock_timeout_s. A rank creating a large pool holds it while prefaulting (raise "
        "lock_timeout_s); a process that hangs holding it must be stopped",
        holder=holder,
    )


def note_holder(fd: int) -> None:
    """Write this process's pid into the lock file it now holds, for those who wait on it."""
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)


def lock_holder(fd: int, locks: Path = PROC_LOCKS) -> int | None:
    """The pid holding a flock on the file open as `fd`: from /proc/locks, else the pid the
    holder wrote into the file (`note_holder`), else None."""
    info = os.fstat(fd)
    key = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    try:
        lines = locks.read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        fields = line.split()
        # "1: FLOCK  ADVISORY  WRITE 1234 00:1a:5678 0 EOF"; a waiter has "->" after the id.
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == key:
            if fields[4].isdigit() and int(fields[4]) > 0:  # 0: in a pid namespace not ours
                return int(fields[4])
            break
    try:
        noted = os.pread(fd, 32, 0).decode(errors="replace").strip()
    except OSError:
        return None
    return int(noted) if noted.isdigit() else None


def _command(pid: int) -> str:
    try:
        return f" ({Path(f'/proc/{pid}/comm').read_text().strip()})"
    except OSError:
        return ""
