"""Faults in the middle of pinning: whatever stops the registration (a failing driver call, an
exception, Ctrl-C in the calling thread or inside a call), every chunk registered so far is
unregistered before the host pool is unmapped, and nothing stays registered or mapped."""

from __future__ import annotations

import gc
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest

pytest.importorskip("torch")  # the backend is an extra: skip without it

from hisparse_plan.torch import Chunk, RegistrationError, allocate
from hisparse_plan.torch.hostmem.mapping import HostBuffer
from hisparse_plan.torch.hostmem.registration import Registration
from hisparse_plan.torch.hostmem.tasks import run_tasks
from hisparse_plan.torch.vllm import pools as pools_module
from hisparse_plan.torch.vllm.host import host_pool_bytes
from support.torch_support import FakeRegistrar, mapped, small_plan

CHUNK = 4 * 2**20
PLAN = small_plan()
SIZE = host_pool_bytes(PLAN)
CHUNKS = -(-SIZE // CHUNK)
"""The small plan's host pool in 4 MiB chunks (its pages are 4 KiB multiples, so every
chunk edge is a page edge): 10 chunks."""


class InjectingRegistrar(FakeRegistrar):
    """Raises `kind` in register call number `at`, after really registering that chunk when
    `registered_first` (an interrupt landing right after the driver returned) or before (one
    landing before the driver did anything)."""

    def __init__(self, at: int, kind: type[BaseException], *, registered_first: bool) -> None:
        super().__init__()
        self.at = at
        self.kind = kind
        self.registered_first = registered_first
        self.count = 0

    def register(self, address: int, nbytes: int) -> int:
        with self._lock:
            number = self.count
            self.count += 1
        if number != self.at:
            return super().register(address, nbytes)
        if self.registered_first:
            super().register(address, nbytes)
        raise self.kind(f"injected in register call {number}")


class RecordingBuffer(HostBuffer):
    """A HostBuffer that notes where it was mapped."""

    mapped: ClassVar[list[tuple[int, int]]] = []

    def __init__(self, nbytes: int, **kwargs: Any) -> None:
        super().__init__(nbytes, **kwargs)
        RecordingBuffer.mapped.append((self.address, nbytes))


@pytest.fixture
def buffers(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """(address, bytes) of every host pool mapped during the test."""
    RecordingBuffer.mapped = []
    monkeypatch.setattr(pools_module, "HostBuffer", RecordingBuffer)
    return RecordingBuffer.mapped


@pytest.fixture(autouse=True)
def default_sigint() -> Iterator[None]:
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_the_small_plan_has_many_chunks() -> None:
    assert CHUNKS >= 8


@pytest.mark.parametrize("registered_first", [False, True], ids=["before", "after"])
@pytest.mark.parametrize("kind", [KeyboardInterrupt, RuntimeError, SystemExit])
@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("at", range(CHUNKS))
def test_a_fault_at_any_chunk_leaves_nothing_registered_or_mapped(
    at: int, threads: int, kind: type[BaseException], registered_first: bool,
    buffers: list[tuple[int, int]],
) -> None:
    registrar = InjectingRegistrar(at, kind, registered_first=registered_first)
    # A failed driver call becomes a RegistrationError; an interrupt stays what it is.
    expected = RegistrationError if issubclass(kind, Exception) else kind
    with pytest.raises(expected):
        allocate(PLAN, device="cpu", pin=True, register_chunk_bytes=CHUNK, registrar=registrar,
                 prefault_threads=threads)
    assert registrar.registered == {}
    [(address, size)] = buffers
    assert size == SIZE
    assert not mapped(address, size)
    # Undoing starts once no register call runs any more: none comes after an unregister.
    calls = [call for call, _ in registrar.calls]
    if "unregister" in calls:
        assert "register" not in calls[calls.index("unregister"):]


class SlowRegistrar(FakeRegistrar):
    """Each call takes a while; chunk `at` sends SIGINT to the main thread once it is inside
    the driver, as Ctrl-C would while workers register."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at = at
        self.started = 0
        self.running = 0
        self.running_at_interrupt: list[int] = []

    def register(self, address: int, nbytes: int) -> int:
        with self._lock:
            index = self.started
            self.started += 1
            self.running += 1
        try:
            if index == self.at:
                signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)
            time.sleep(0.02)
            return super().register(address, nbytes)
        finally:
            with self._lock:
                self.running -= 1

    def unregister(self, address: int) -> int:
        with self._lock:
            self.running_at_interrupt.append(self.running)
        return super().unregister(address)


@pytest.mark.parametrize("at", [0, 2, 5])
def test_ctrl_c_in_the_main_thread_while_workers_register(
    at: int, buffers: list[tuple[int, int]]
) -> None:
    registrar = SlowRegistrar(at)
    with pytest.raises(KeyboardInterrupt):
        allocate(PLAN, device="cpu", pin=True, register_chunk_bytes=CHUNK, registrar=registrar,
                 prefault_threads=3)
    assert registrar.registered == {}
    [(address, size)] = buffers
    assert not mapped(address, size)
    # No chunk was still being registered when undoing began, and the rest never started.
    assert registrar.running_at_interrupt
    assert set(registrar.running_at_interrupt) == {0}
    assert registrar.started < CHUNKS


def chunks(count: int) -> list[Chunk]:
    return [Chunk(i, i * 4096, (i + 1) * 4096) for i in range(count)]


def test_an_interrupt_while_undoing_still_undoes_the_rest() -> None:
    base = 1 << 40
    registrar = FakeRegistrar()
    registration = Registration(base, registrar)
    registration.register(chunks(5))
    calls = 0
    unregister = registrar.unregister

    def interrupted_once(address: int) -> int:
        nonlocal calls
        calls += 1
        code = unregister(address)
        if calls == 2:
            raise KeyboardInterrupt  # after the driver call: the chunk is unregistered
        return code

    registrar.unregister = interrupted_once  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        registration.unregister()
    assert registrar.registered == {}
    assert registration.clean


def test_a_failed_unregister_is_remembered() -> None:
    registrar = FakeRegistrar(fail_unregister={(1 << 40) + 4096})
    registration = Registration(1 << 40, registrar)
    registration.register(chunks(3))
    with pytest.raises(RegistrationError, match="chunk 1"):
        registration.unregister()
    assert [chunk.index for chunk in registration.stranded] == [1]
    assert not registration.clean


def test_run_tasks_stops_and_waits_on_a_failure() -> None:
    started: list[int] = []
    running = 0
    lock = threading.Lock()
    running_when_raised: list[int] = []

    def work(item: int) -> int:
        nonlocal running
        with lock:
            started.append(item)
            running += 1
        try:
            time.sleep(0.01)
            if item == 3:
                raise ValueError("item 3")
            return item * 2
        finally:
            with lock:
                running -= 1

    seen: list[tuple[str, int, int]] = []
    def batch() -> None:
        try:
            run_tasks(range(100), work, threads=4, step="test",
                      progress=lambda *args: seen.append(args))
        finally:
            running_when_raised.append(running)

    with pytest.raises(ValueError, match="item 3"):
        batch()
    assert running_when_raised == [0]
    assert len(started) < 100
    assert seen[0] == ("test", 0, 100)
    assert run_tasks(range(3), work, threads=2, step="test") == [0, 2, 4]


def test_gc_after_a_fault_leaves_nothing(buffers: list[tuple[int, int]]) -> None:
    registrar = InjectingRegistrar(1, KeyboardInterrupt, registered_first=True)
    with pytest.raises(KeyboardInterrupt):
        allocate(PLAN, device="cpu", pin=True, register_chunk_bytes=CHUNK, registrar=registrar,
                 prefault_threads=0)
    gc.collect()
    assert registrar.registered == {}
    [(address, size)] = buffers
    assert not mapped(address, size)


def test_an_in_flight_chunk_without_an_answer_is_stranded() -> None:
    registrar = InjectingRegistrar(2, RuntimeError, registered_first=True)
    registration = Registration(1 << 40, registrar)
    unregister = registrar.unregister

    def silent(address: int) -> int:
        if address == (1 << 40) + 2 * 4096:
            raise RuntimeError("driver gone")  # no answer: the chunk may still be registered
        return unregister(address)

    registrar.unregister = silent  # type: ignore[method-assign]
    with pytest.raises(RegistrationError, match=r"chunk 2.*rolling back .* failed too"):
        registration.register(chunks(4))
    assert [chunk.index for chunk in registration.stranded] == [2]
    assert not registration.clean
