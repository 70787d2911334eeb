"""The shared host pool as a trust boundary: /dev/shm is every user's, so a pool name another
user took (a file of theirs, a symbolic link, a directory) is refused saying so and left
alone, a held lock is waited for only so long, a pool file shrunk under a rank is an error
before it can be a SIGBUS, and a failed allocation leaves no file it made.

The other user is uid 65534 ('nobody'), in a process that drops to it: those tests need root
and are skipped otherwise."""

from __future__ import annotations

import fcntl
import logging
import multiprocessing
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("torch")  # the backend is an extra: skip without it

from hisparse_plan.torch import BackendError, Pools, allocate
from hisparse_plan.torch.hostmem import locks as locks_module
from hisparse_plan.torch.hostmem.locks import (
    DEFAULT_LOCK_TIMEOUT_S,
    LockTimeoutError,
    lock_holder,
    note_holder,
)
from hisparse_plan.torch.hostmem.mapping import OS_PAGE, HostBuffer
from hisparse_plan.torch.hostmem.shm import lock_path, pool_path
from hisparse_plan.torch.vllm.host import host_pool_bytes
from support.shm_support import NOBODY, Intruder, remove, truncated_rank
from support.torch_support import FakeRegistrar, shared_memory_usable, shared_plan

pytestmark = pytest.mark.skipif(not shared_memory_usable(), reason="no writable /dev/shm")

PLAN = shared_plan()
SIZE = host_pool_bytes(PLAN)
SPAWN = multiprocessing.get_context("spawn")
AS_ROOT = pytest.mark.skipif(
    os.geteuid() != 0, reason="acting as a second user (uid 65534) needs root")
REFUSED = ("refusing it, since another user may have made it to read the pool")


@pytest.fixture
def name() -> Iterator[str]:
    """A fresh pool name; whatever the test or an intruder put at its paths is removed."""
    fresh = f"trust-{uuid.uuid4().hex[:12]}"
    yield fresh
    remove(pool_path(fresh), lock_path(fresh))


@pytest.fixture
def elsewhere() -> Iterator[Path]:
    """A path in /dev/shm outside the pool's names (a link target), removed afterwards."""
    path = pool_path(f"trust-target-{uuid.uuid4().hex[:12]}")
    yield path
    remove(path)


def shared(name: str, *, pin: bool = False, registrar: FakeRegistrar | None = None,
           lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S) -> Pools:
    return allocate(PLAN, device="cpu", pin=pin, registrar=registrar, host_pool_name=name,
                    prefault_threads=1, lock_timeout_s=lock_timeout_s)


@AS_ROOT
def test_a_pool_file_another_user_left_open_to_all_is_never_attached(name: str) -> None:
    # The other user's pool file at the plan's size, mode 0666, held like a live pool: an
    # attach would hand them every byte of the KV cache.
    intruder = Intruder(NOBODY, "squat", pool_path(name), SIZE, "666", "held")
    try:
        with pytest.raises(BackendError) as caught:
            shared(name)
    finally:
        read = intruder.done()
    message = str(caught.value)
    assert (f"shared host pool {name!r}: {pool_path(name)} belongs to uid {NOBODY} "
            f"(mode 0666), not to this process's uid 0") in message
    assert REFUSED in message
    assert "expected a writable" not in message
    assert read == "00" * 64  # nothing of this process's reached their file
    assert os.stat(pool_path(name)).st_uid == NOBODY  # left to its owner
    assert not os.path.lexists(lock_path(name))  # the lock this call made is gone


@AS_ROOT
def test_a_stale_looking_pool_of_another_user_is_refused_not_replaced(name: str) -> None:
    intruder = Intruder(NOBODY, "squat", pool_path(name), SIZE, "600", "unheld")
    try:
        with pytest.raises(BackendError, match=(
                rf"belongs to uid {NOBODY} \(mode 0600\), not to this process's uid 0")):
            shared(name)
    finally:
        intruder.done()
    assert os.stat(pool_path(name)).st_uid == NOBODY
    assert not os.path.lexists(lock_path(name))


@AS_ROOT
def test_a_pool_name_that_is_another_users_link_is_not_followed(
    name: str, elsewhere: Path
) -> None:
    # Root's file of the pool's size, readable by all; the other user holds it and links the
    # pool's name to it: followed, this process would write the KV cache into that file.
    fd = os.open(elsewhere, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.fchmod(fd, 0o644)
        os.ftruncate(fd, SIZE)
        os.pwrite(fd, b"precious", 0)
    finally:
        os.close(fd)
    intruder = Intruder(NOBODY, "link", pool_path(name), elsewhere)
    try:
        with pytest.raises(BackendError) as caught:
            shared(name)
    finally:
        intruder.done()
    message = str(caught.value)
    assert (f"{pool_path(name)} is a symbolic link (owner uid {NOBODY}) to "
            f"'{elsewhere}'") in message
    assert REFUSED in message
    assert elsewhere.read_bytes()[:8] == b"precious"
    assert os.path.islink(pool_path(name))  # left to its owner
    assert not os.path.lexists(lock_path(name))


@AS_ROOT
def test_a_lock_name_that_is_another_users_link_creates_nothing(
    name: str, elsewhere: Path
) -> None:
    intruder = Intruder(NOBODY, "link", lock_path(name), elsewhere)
    try:
        with pytest.raises(BackendError) as caught:
            shared(name)
    finally:
        intruder.done()
    assert f"{lock_path(name)} is a symbolic link (owner uid {NOBODY})" in str(caught.value)
    assert not os.path.lexists(elsewhere)  # root did not create the link's target
    assert not os.path.lexists(pool_path(name))


@AS_ROOT
def test_a_lock_file_of_another_user_is_refused(name: str) -> None:
    # Theirs, open to all: they could hold it (stalling every rank) or read who holds it.
    intruder = Intruder(NOBODY, "squat", lock_path(name), 0, "666", "unheld")
    try:
        with pytest.raises(BackendError, match=(
                rf"{lock_path(name)} belongs to uid {NOBODY} \(mode 0666\), not to this "
                "process's uid 0")):
            shared(name)
    finally:
        intruder.done()
    assert os.stat(lock_path(name)).st_uid == NOBODY
    assert not os.path.lexists(pool_path(name))


@AS_ROOT
def test_a_directory_at_the_pool_name_is_refused_and_leaves_no_lock(name: str) -> None:
    intruder = Intruder(NOBODY, "directory", pool_path(name))
    try:
        with pytest.raises(BackendError) as caught:
            shared(name)
    finally:
        intruder.done()
    message = str(caught.value)
    assert f"{pool_path(name)} is not a regular file (mode drwxrwxrwx)" in message
    assert "expected a writable" not in message
    assert not os.path.lexists(lock_path(name))


def test_a_pool_file_of_this_user_open_to_others_is_refused(name: str) -> None:
    old = os.umask(0)
    try:
        fd = os.open(pool_path(name), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    finally:
        os.umask(old)
    try:
        os.ftruncate(fd, SIZE)
        fcntl.flock(fd, fcntl.LOCK_SH)  # held: it looks live
        with pytest.raises(BackendError, match=(
                r"has mode 0644; expected 0600 \(no group or other access\)")):
            shared(name)
    finally:
        os.close(fd)
    assert not os.path.lexists(lock_path(name))


def test_a_link_at_the_pool_name_is_refused_for_any_owner(name: str, elsewhere: Path) -> None:
    elsewhere.write_bytes(b"")
    os.symlink(elsewhere, pool_path(name))
    with pytest.raises(BackendError, match=r"is a symbolic link \(owner uid \d+\)"):
        shared(name)
    assert os.path.islink(pool_path(name))
    assert not os.path.lexists(lock_path(name))


def test_the_pool_and_lock_files_are_this_users_alone(name: str) -> None:
    old = os.umask(0)  # the files' mode must not depend on the caller's umask
    try:
        pools = shared(name)
    finally:
        os.umask(old)
    try:
        for path in (pool_path(name), lock_path(name)):
            info = os.stat(path, follow_symlinks=False)
            assert (info.st_mode & 0o777, info.st_uid) == (0o600, os.geteuid()), path
        assert lock_path(name).read_text() == f"{os.getpid()}\n"  # who holds it, for waiters
    finally:
        pools.release()


def test_a_lock_held_forever_times_out_naming_its_holder(name: str) -> None:
    holder = Intruder(os.geteuid(), "lock", lock_path(name))
    try:
        with pytest.raises(LockTimeoutError) as caught:
            shared(name, lock_timeout_s=0.3)
    finally:
        holder.done()
    error = caught.value
    assert isinstance(error, BackendError)
    assert error.holder == holder.pid
    assert str(error).startswith(
        f"waited 0.3 s for the lock {lock_path(name)} of shared host pool {name!r}, held by "
        f"pid {holder.pid} (")
    assert not os.path.lexists(pool_path(name))


@pytest.mark.parametrize("timeout", [0.0, -1.0, float("nan")])
def test_a_lock_timeout_must_be_positive(name: str, timeout: float) -> None:
    with pytest.raises(BackendError, match="lock_timeout_s is"):
        shared(name, lock_timeout_s=timeout)
    assert not os.path.lexists(lock_path(name))


def test_the_holder_is_read_from_its_note_without_proc_locks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "x.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        note_holder(fd)
        assert lock_holder(fd, tmp_path / "no-proc-locks") == os.getpid()
        os.ftruncate(fd, 0)
        assert lock_holder(fd, tmp_path / "no-proc-locks") is None
        fcntl.flock(fd, fcntl.LOCK_EX)
        if locks_module.PROC_LOCKS.exists():
            assert lock_holder(fd) == os.getpid()  # the kernel's word, no note needed
    finally:
        os.close(fd)


def test_a_release_that_cannot_take_the_lock_still_lets_go(
    name: str, caplog: pytest.LogCaptureFixture
) -> None:
    pools = shared(name, lock_timeout_s=0.2)
    blocker = os.open(lock_path(name), os.O_RDWR)
    try:
        fcntl.flock(blocker, fcntl.LOCK_EX)
        with pytest.raises(LockTimeoutError):
            pools.release()
    finally:
        os.close(blocker)
    # This process's hold is gone: the next start finds the pool unheld and replaces it.
    with caplog.at_level(logging.WARNING, logger="hisparse_plan"):
        again = shared(name)
    assert again.shared is not None
    assert again.shared.created
    assert any("held by no process" in record.getMessage() for record in caplog.records)
    again.release()
    assert not os.path.lexists(pool_path(name))
    assert not os.path.lexists(lock_path(name))


def test_a_pool_shrunk_under_a_rank_is_refused_before_views_touch_it(name: str) -> None:
    pools = shared(name)
    try:
        os.truncate(pool_path(name), OS_PAGE)
        message = (f"shared host pool {name!r}: {pool_path(name)} has {OS_PAGE} bytes, but it "
                   f"was made with {SIZE}; expected it unchanged before binding views on it")
        with pytest.raises(BackendError) as caught:
            pools.views()
        assert str(caught.value).startswith(message)
        assert "SIGBUS" in str(caught.value)
    finally:
        pools.release()
    assert not os.path.lexists(pool_path(name))


def test_a_pool_shrunk_before_registration_is_refused(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefault = HostBuffer.prefault

    def prefault_then_cut(buffer: HostBuffer, *args: object, **kwargs: object) -> None:
        prefault(buffer, *args, **kwargs)  # type: ignore[arg-type]
        os.truncate(pool_path(name), OS_PAGE)

    monkeypatch.setattr(HostBuffer, "prefault", prefault_then_cut)
    registrar = FakeRegistrar()
    with pytest.raises(BackendError, match=(
            rf"has {OS_PAGE} bytes, but it was made with {SIZE}; expected it unchanged before "
            "registering it with CUDA")):
        shared(name, pin=True, registrar=registrar)
    assert registrar.calls == []
    assert not os.path.lexists(pool_path(name))
    assert not os.path.lexists(lock_path(name))


@pytest.mark.parametrize(("when", "doing"), [("prefault", "prefaulting it"),
                                             ("verify", "verifying it")])
def test_a_pool_shrunk_under_a_rank_is_an_error_not_a_sigbus(
    name: str, when: str, doing: str
) -> None:
    connection, child = SPAWN.Pipe()
    rank = SPAWN.Process(target=truncated_rank, args=(child, PLAN.model_dump_json(), name, when),
                         daemon=True)
    rank.start()
    child.close()
    answered = connection.poll(120)
    rank.join(30)
    assert rank.exitcode == 0, f"the rank died (exit code {rank.exitcode}: -7 is SIGBUS)"
    assert answered
    message = connection.recv()
    assert f"expected it unchanged before {doing}" in message
    assert not os.path.lexists(pool_path(name))
    assert not os.path.lexists(lock_path(name))
