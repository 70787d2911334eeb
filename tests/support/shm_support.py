"""Another user on the machine, for the shared-pool trust-boundary tests: a process that drops
to uid 65534 ('nobody') and takes a pool's name in /dev/shm; and a rank in a child process,
for the steps that would kill the test process with SIGBUS if the backend failed to refuse
them. This module holds no tests itself."""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import sys
from pathlib import Path
from typing import Any
from unittest import mock

NOBODY = 65534

INTRUDER = r"""
import fcntl, os, sys
uid = int(sys.argv[1])
if uid != os.geteuid():  # everything is imported already: drop to the other user now
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
action, path = sys.argv[2], sys.argv[3]
os.umask(0)  # the modes asked for, exactly
fd = -1
if action == "squat":  # a pool file of this user, held like a live pool
    size, mode, hold = int(sys.argv[4]), int(sys.argv[5], 8), sys.argv[6] == "held"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, mode)
    os.ftruncate(fd, size)
    if hold:
        fcntl.flock(fd, fcntl.LOCK_SH)
elif action == "link":  # a symbolic link at the name; its target held if it exists
    os.symlink(sys.argv[4], path)
    if os.path.exists(sys.argv[4]):
        fd = os.open(sys.argv[4], os.O_RDONLY)
        fcntl.flock(fd, fcntl.LOCK_SH)
elif action == "directory":
    os.mkdir(path, 0o777)
elif action == "lock":  # the lock, held and never let go
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
print("ready", flush=True)
sys.stdin.readline()
if action == "squat":  # what the other user reads of the pool
    print(os.pread(fd, 64, 0).hex(), flush=True)
"""


class Intruder:
    """A process of user `uid` that did `action` on `path` and waits; `done()` lets it go and
    returns what it printed after 'ready' (for a squatted pool: its first 64 bytes, hex)."""

    def __init__(self, uid: int, action: str, path: Path, *args: object) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", INTRUDER, str(uid), action, str(path), *map(str, args)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            cwd="/",
        )
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], 60)
        line = self.process.stdout.readline() if ready else ""
        if line.strip() != "ready":
            self.process.kill()
            _, errors = self.process.communicate(timeout=30)
            raise AssertionError(f"the intruder did not start: {errors}")

    @property
    def pid(self) -> int:
        return self.process.pid

    def done(self) -> str:
        out, _ = self.process.communicate("go\n", timeout=30)
        return out.strip()


def remove(*paths: Path) -> None:
    """Remove whatever is at `paths`: files, links (not their targets) and empty folders."""
    for path in paths:
        if path.is_dir() and not path.is_symlink():
            path.rmdir()
        elif os.path.lexists(path):
            path.unlink()


def truncated_rank(connection: Any, plan_json: str, name: str, when: str) -> None:
    """A rank that allocates the shared pool while the pool file is cut to one page `when`
    ("prefault": just before prefaulting; "verify": before verifying): sends the error it got,
    or "no error". Dies by SIGBUS (sending nothing) if the cut pool is touched."""
    import hisparse_plan as hp
    from hisparse_plan.torch import BackendError, allocate, verify
    from hisparse_plan.torch.hostmem.mapping import OS_PAGE, HostBuffer
    from hisparse_plan.torch.hostmem.shm import pool_path
    from hisparse_plan.torch.hostmem.tasks import Progress

    plan = hp.KVCachePlan.model_validate_json(plan_json)
    prefault = HostBuffer.prefault

    def cut_then_prefault(buffer: HostBuffer, threads: int,
                          progress: Progress | None = None) -> None:
        os.truncate(pool_path(name), OS_PAGE)
        prefault(buffer, threads, progress)

    cut = (mock.patch.object(HostBuffer, "prefault", cut_then_prefault) if when == "prefault"
           else contextlib.nullcontext())
    try:
        with cut, allocate(plan, device="cpu", pin=False, host_pool_name=name,
                           prefault_threads=1) as pools:
            if when == "verify":
                os.truncate(pool_path(name), OS_PAGE)
                verify(plan, pools)
    except BackendError as error:
        connection.send(str(error))
    else:
        connection.send("no error")
    connection.close()
