"""One host pool for every rank: named shared memory, created once, attached by the others,
counted once against host RAM, removed by the last rank, and never blocked by a dead one."""

from __future__ import annotations

import logging
import multiprocessing
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")  # the backend is an extra: skip without it

from hisparse_plan.torch import BackendError, HostMemory, HostMemoryError, allocate, verify
from hisparse_plan.torch.hostmem import shm as shm_module
from hisparse_plan.torch.hostmem.mapping import OS_PAGE, HostBuffer
from hisparse_plan.torch.hostmem.shm import lock_path, pool_path
from hisparse_plan.torch.vllm import pools as pools_module
from hisparse_plan.torch.vllm.host import host_pool_bytes
from support.torch_support import (
    FakeRegistrar,
    mapped,
    numa_binding_works,
    pattern,
    rank,
    shared_memory_usable,
    shared_plan,
    small_plan,
    torch,
)

pytestmark = pytest.mark.skipif(not shared_memory_usable(), reason="no writable /dev/shm")

PLAN = shared_plan()
SPAWN = multiprocessing.get_context("spawn")


@pytest.fixture
def name() -> Iterator[str]:
    """A fresh pool name; the test fails if it leaves anything in /dev/shm."""
    fresh = f"test-{uuid.uuid4().hex[:12]}"
    yield fresh
    left = [path for path in (pool_path(fresh), lock_path(fresh)) if path.exists()]
    for path in left:
        path.unlink()
    assert left == [], "the test left files in /dev/shm"


def leftovers(name: str) -> list[Path]:
    return [path for path in (pool_path(name), lock_path(name)) if path.exists()]


class Rank:
    """Another process holding (or about to hold) the pool."""

    def __init__(self, name: str, plan_json: str | None = None) -> None:
        self.connection, child = SPAWN.Pipe()
        self.process = SPAWN.Process(
            target=rank, args=(child, plan_json or PLAN.model_dump_json(), name), daemon=True)
        self.process.start()
        child.close()
        reply = self.ask_nothing()
        self.created, self.ram_counted = reply[1], reply[2]

    def ask_nothing(self) -> Any:
        if not self.connection.poll(120):
            raise AssertionError("the other rank did not answer")
        return self.connection.recv()

    def ask(self, command: str, seed: int | None = None) -> Any:
        self.connection.send((command, seed))
        return self.ask_nothing()

    def close(self) -> None:
        assert self.ask("close") == "closed"
        self.process.join(30)

    def kill(self) -> None:
        self.process.kill()
        self.process.join(30)


def test_the_pool_is_page_rounded_block_stride_times_blocks() -> None:
    pool = PLAN.host_pool
    assert pool is not None
    assert pool.shared
    assert pool.bytes_per_block % OS_PAGE != 0  # the case where the two readings differ
    assert pool.block_stride * pool.num_blocks > pool.size
    assert host_pool_bytes(PLAN) == -(-pool.block_stride * pool.num_blocks // OS_PAGE) * OS_PAGE


def test_two_ranks_in_one_process_share_one_pool(name: str) -> None:
    size = host_pool_bytes(PLAN)
    first = allocate(PLAN, device="cpu", pin=False, host_pool_name=name, prefault_threads=2)
    second = allocate(PLAN, device="cpu", pin=False, host_pool_name=name, prefault_threads=2)
    assert first.shared is not None
    assert second.shared is not None
    assert (first.shared.created, second.shared.created) == (True, False)
    assert (first.ram_counted, second.ram_counted) == (size, 0)
    assert os.stat(pool_path(name)).st_size == size
    one, two = first.host, second.host
    assert one is not None
    assert two is not None
    assert one.numel() == two.numel() == size
    assert one.data_ptr() != two.data_ptr()  # two mappings of one memory
    one.copy_(pattern(1, size))
    assert torch.equal(two, pattern(1, size))
    second.views()["model.layers.2.self_attn.attn"][5].fill_(7)
    assert torch.equal(first.views()["model.layers.2.self_attn.attn"][5],
                       torch.full_like(first.views()["model.layers.2.self_attn.attn"][5], 7))
    assert "created by this process" in first.summary()
    assert "attached, counted by the process that created it" in second.summary()
    address = one.data_ptr()
    del one, two
    first.release()  # the creator goes first: the pool stays for the other rank
    assert leftovers(name) == [pool_path(name), lock_path(name)]
    host = second.host
    assert host is not None
    assert torch.equal(host[:4096], pattern(1, size)[:4096])
    del host
    second.release()
    assert leftovers(name) == []
    assert not mapped(address, size)


def test_verify_runs_on_a_shared_pool(name: str) -> None:
    with allocate(PLAN, device="cpu", pin=False, host_pool_name=name) as pools:
        report = verify(PLAN, pools)
    assert not report.sampled
    assert leftovers(name) == []


def test_two_processes_see_each_others_writes(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    other = Rank(name)
    size = host_pool_bytes(PLAN)
    assert (other.created, other.ram_counted) == (True, size)
    # Counted once: this process attaches with too little RAM for a second copy of the pool
    # (but enough for its CPU device pool), which a creator would be refused.
    scarce = HostMemory(int(PLAN.device_pool.size / 0.95) + OS_PAGE, "MemAvailable (test)")
    monkeypatch.setattr(pools_module, "available_host_memory", lambda: scarce)
    pools = allocate(PLAN, device="cpu", pin=False, host_pool_name=name)
    assert pools.shared is not None
    assert not pools.shared.created
    assert pools.ram_counted == 0
    host = pools.host
    assert host is not None
    assert other.ask("write", 11) == "written"
    assert torch.equal(host, pattern(11, size))
    host.copy_(pattern(12, size))
    assert other.ask("check", 12) is True
    assert other.ask("check", 11) is False
    del host
    pools.release()
    assert leftovers(name) != []  # the other rank still holds it
    other.close()
    assert leftovers(name) == []


def test_a_creator_is_counted_and_refused_without_the_ram(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    scarce = HostMemory(int(PLAN.device_pool.size / 0.95) + OS_PAGE, "MemAvailable (test)")
    monkeypatch.setattr(pools_module, "available_host_memory", lambda: scarce)
    with pytest.raises(HostMemoryError, match=f"the shared host pool '{name}' \\(created here\\)"):
        allocate(PLAN, device="cpu", pin=False, host_pool_name=name)
    assert leftovers(name) == []


def test_a_killed_creator_does_not_block_a_new_start(
    name: str, caplog: pytest.LogCaptureFixture
) -> None:
    dead = Rank(name)
    assert dead.created
    dead.kill()
    assert pool_path(name).exists()  # what a SIGKILL leaves behind
    with caplog.at_level(logging.WARNING, logger="hisparse_plan"):
        pools = allocate(PLAN, device="cpu", pin=False, host_pool_name=name)
    assert pools.shared is not None
    assert pools.shared.created
    warned = [r for r in caplog.records if r.levelno == logging.WARNING
              and "held by no process" in r.getMessage()]
    assert len(warned) == 1
    assert str(pool_path(name)) in warned[0].getMessage()
    pools.release()
    assert leftovers(name) == []


def test_a_dead_creators_pool_of_another_size_is_replaced(name: str) -> None:
    dead = Rank(name, shared_plan(blocks=300).model_dump_json())
    dead.kill()
    with allocate(PLAN, device="cpu", pin=False, host_pool_name=name) as pools:
        assert pools.shared is not None
        assert pools.shared.created
        assert os.stat(pool_path(name)).st_size == host_pool_bytes(PLAN)


def test_a_live_pool_of_another_size_is_refused(name: str) -> None:
    other = shared_plan(blocks=300)
    with allocate(other, device="cpu", pin=False, host_pool_name=name):
        with pytest.raises(BackendError, match=(
                f"has {host_pool_bytes(other)} bytes, but this plan's pool has "
                f"{host_pool_bytes(PLAN)}; expected every rank to allocate the same plan")):
            allocate(PLAN, device="cpu", pin=False, host_pool_name=name)
        assert pool_path(name).exists()
    assert leftovers(name) == []


def test_a_failed_attach_leaves_the_pool_to_its_holders(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with allocate(PLAN, device="cpu", pin=False, host_pool_name=name) as first:
        def broken(*args: object, **kwargs: object) -> None:
            raise OSError("prefault failed (test)")

        monkeypatch.setattr(HostBuffer, "prefault", broken)
        with pytest.raises(OSError, match="prefault failed"):
            allocate(PLAN, device="cpu", pin=False, host_pool_name=name)
        monkeypatch.undo()
        assert first.host is not None
        assert pool_path(name).exists()
    assert leftovers(name) == []


def test_a_failed_create_removes_the_pool(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(HostBuffer, "prefault", broken)
    with pytest.raises(KeyboardInterrupt):
        allocate(PLAN, device="cpu", pin=False, host_pool_name=name)
    assert leftovers(name) == []


def test_a_name_on_a_private_pool_is_refused(name: str) -> None:
    plan = small_plan()
    assert plan.host_pool is not None
    assert not plan.host_pool.shared
    with pytest.raises(BackendError, match=r"the plan's host_pool.shared is false"):
        allocate(plan, device="cpu", pin=False, host_pool_name=name)
    assert leftovers(name) == []


@pytest.mark.parametrize("bad", ["", "a/b", "../x", ".hidden", "x" * 129, "a b"])
def test_bad_names_are_refused(bad: str) -> None:
    with pytest.raises(BackendError, match="host_pool_name is"):
        allocate(PLAN, device="cpu", pin=False, host_pool_name=bad)


def test_a_shared_pool_on_meta_is_refused(name: str) -> None:
    with pytest.raises(BackendError, match="meta pools hold no memory to share"):
        allocate(PLAN, device="meta", pin=False, host_pool_name=name)


def test_without_a_name_a_shared_plan_gets_a_private_pool_of_the_same_size() -> None:
    with allocate(PLAN, device="cpu", pin=False) as pools:
        assert pools.shared is None
        assert pools.host is not None
        assert pools.host.numel() == host_pool_bytes(PLAN)


def test_a_pool_larger_than_dev_shm_is_refused(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    statvfs = os.statvfs

    def small_shm(path: Any) -> Any:
        real = statvfs(path)
        return type("Small", (), {"f_bavail": 64, "f_frsize": 4096, "f_bsize": real.f_bsize})()

    monkeypatch.setattr(os, "statvfs", small_shm)
    with pytest.raises(HostMemoryError, match=(
            r"the shared host pool needs .*, but /dev/shm has only 0.00 GiB \(262144 bytes\) "
            r"free; .*--shm-size")):
        allocate(PLAN, device="cpu", pin=False, host_pool_name=name)
    assert leftovers(name) == []


def test_each_rank_pins_for_itself_and_an_interrupted_close_still_lets_go(name: str) -> None:
    first_registrar, second_registrar = FakeRegistrar(), FakeRegistrar()
    first = allocate(PLAN, device="cpu", pin=True, registrar=first_registrar,
                     host_pool_name=name, register_chunk_bytes=2**20)
    second = allocate(PLAN, device="cpu", pin=True, registrar=second_registrar,
                      host_pool_name=name, register_chunk_bytes=2**20)
    one, two = first.host, second.host
    assert one is not None
    assert two is not None
    # Each process registers its own mapping of the pool, whole.
    assert min(first_registrar.registered) == one.data_ptr()
    assert min(second_registrar.registered) == two.data_ptr()
    assert sum(second_registrar.registered.values()) == host_pool_bytes(PLAN)
    del one, two
    unregister = second_registrar.unregister
    calls = 0

    def interrupted(address: int) -> int:
        nonlocal calls
        calls += 1
        code = unregister(address)
        if calls == 1:
            raise KeyboardInterrupt  # Ctrl-C right after the first driver call
        return code

    second_registrar.unregister = interrupted  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        second.release()
    assert second_registrar.registered == {}
    first.release()
    assert first_registrar.registered == {}
    assert leftovers(name) == []


def test_an_unusable_shared_memory_directory_is_a_backend_error(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shm_module, "SHM_DIR", tmp_path / "missing")
    with pytest.raises(BackendError, match=(
            rf"shared host pool '{name}': locking {tmp_path}/missing/hisparse_plan-{name}.lock "
            r"failed: No such file or directory; expected a writable")):
        allocate(PLAN, device="cpu", pin=False, host_pool_name=name)


def test_the_files_may_live_elsewhere(name: str, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shm_module, "SHM_DIR", tmp_path)
    with allocate(PLAN, device="cpu", pin=False, host_pool_name=name) as pools:
        assert pools.shared is not None
        assert pools.shared.path == tmp_path / f"hisparse_plan-{name}.pool"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not numa_binding_works(), reason="this process cannot bind to NUMA node 0")
def test_an_attaching_process_reports_the_creators_placement(name: str) -> None:
    with allocate(PLAN, device="cpu", pin=False, host_pool_name=name, numa_node=0) as first, \
            allocate(PLAN, device="cpu", pin=False, host_pool_name=name) as second:
        assert first.numa is not None
        assert second.numa is not None
        assert (first.numa.node, first.numa.policy) == (0, "MPOL_BIND")
        assert (second.numa.node, second.numa.policy) == (0, "MPOL_BIND")
        assert "set by the process that created the shared pool" in second.summary()
        with pytest.raises(BackendError, match="numa_node=1 was asked for, but the shared host "
                                               "pool this process attached lives on node 0"):
            allocate(PLAN, device="cpu", pin=False, host_pool_name=name, numa_node=1)
    with allocate(PLAN, device="cpu", pin=False, host_pool_name=name) as first, \
            allocate(PLAN, device="cpu", pin=False, host_pool_name=name) as second:
        assert second.numa is not None
        assert second.numa.policy is None
        assert "the process that created the shared pool bound nothing" in second.summary()


def test_files_removed_by_hand_do_not_break_closing(name: str) -> None:
    pools = allocate(PLAN, device="cpu", pin=False, host_pool_name=name)
    pool_path(name).unlink()
    lock_path(name).unlink()
    pools.release()
    assert leftovers(name) == []


def test_a_killed_attacher_does_not_keep_the_pool(name: str) -> None:
    pools = allocate(PLAN, device="cpu", pin=False, host_pool_name=name)
    attacher = Rank(name)
    assert not attacher.created
    assert attacher.ram_counted == 0
    attacher.kill()  # its hold dies with it: this process is now the last holder
    pools.release()
    assert leftovers(name) == []
