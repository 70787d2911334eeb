"""Pinning all or nothing: chunk registration, rollback and release, with a fake registrar;
the real CUDA path where a GPU is present."""

from __future__ import annotations

import gc

import pytest

pytest.importorskip("torch")  # the backend is an extra: skip without it

from hisparse_plan.torch import Chunk, Pools, RegistrationError, allocate, host_trains
from hisparse_plan.torch.hostmem.chunks import lowest_crossing
from hisparse_plan.torch.hostmem.mapping import HostBuffer
from hisparse_plan.torch.hostmem.registration import register_chunks
from hisparse_plan.torch.hostmem.state import STRANDED
from support.torch_support import FakeRegistrar, mapped, small_plan, torch

PAGE = 4096
BASE = 1 << 40


def chunks(count: int, size: int = 4 * PAGE) -> list[Chunk]:
    return [Chunk(i, i * size, (i + 1) * size) for i in range(count)]


@pytest.mark.parametrize("threads", [1, 4])
def test_every_chunk_registers_and_unregisters(threads: int) -> None:
    registrar = FakeRegistrar()
    registration = register_chunks(BASE, chunks(5), registrar, threads=threads)
    assert registrar.registered == {BASE + i * 4 * PAGE: 4 * PAGE for i in range(5)}
    registration.unregister()
    assert registrar.registered == {}
    assert registration.chunks == []


@pytest.mark.parametrize("threads", [1, 4])
def test_a_failed_chunk_rolls_back_the_others(threads: int) -> None:
    registrar = FakeRegistrar(fail={BASE + 2 * 4 * PAGE})
    with pytest.raises(RegistrationError) as caught:
        register_chunks(BASE, chunks(5), registrar, threads=threads)
    assert registrar.registered == {}
    error = caught.value
    assert (error.chunk, error.code) == (2, 2)
    assert "chunk 2 (bytes 32768..49152" in str(error)
    assert "out of memory" in str(error)
    assert "rolled back the" in str(error)
    if threads == 1:  # sequential: stops at the failure, undoes chunks 1 then 0
        assert registrar.calls[-2:] == [("unregister", BASE + 4 * PAGE), ("unregister", BASE)]


def test_a_raising_registrar_still_rolls_back() -> None:
    registrar = FakeRegistrar(raise_on={BASE + 4 * PAGE})
    with pytest.raises(RegistrationError, match="RuntimeError: driver went away"):
        register_chunks(BASE, chunks(3), registrar, threads=3)
    assert registrar.registered == {}


def test_a_failed_rollback_is_reported() -> None:
    registrar = FakeRegistrar(fail={BASE + 4 * PAGE}, fail_unregister={BASE})
    with pytest.raises(RegistrationError, match=r"rolling back the 1 registered chunk.* failed"):
        register_chunks(BASE, chunks(2), registrar)


def test_overlapping_chunks_are_refused_like_cuda_does() -> None:
    overlapping = [Chunk(0, 0, 2 * PAGE), Chunk(1, PAGE, 3 * PAGE)]
    with pytest.raises(RegistrationError, match="already registered"):
        register_chunks(BASE, overlapping, FakeRegistrar())


def test_allocate_pins_in_chunks_and_release_unpins() -> None:
    plan = small_plan()
    registrar = FakeRegistrar()
    with allocate(plan, device="cpu", pin=True, register_chunk_bytes=4 * 2**20,
                  registrar=registrar, prefault_threads=2) as pools:
        assert pools.pinned
        assert pools.host is not None
        base = pools.host.data_ptr()
        assert len(pools.chunks) == len(registrar.registered) > 1
        assert sorted(registrar.registered) == [base + chunk.start for chunk in pools.chunks]
        assert sum(registrar.registered.values()) == pools.host.numel()
        trains = host_trains(plan)
        for chunk in pools.chunks[:-1]:
            assert chunk.end % PAGE == 0
            assert all(lowest_crossing(train, chunk.end) is None for train in trains)
    assert registrar.registered == {}
    assert not pools.pinned
    assert pools.chunks == ()


def test_failed_pinning_frees_everything() -> None:
    plan = small_plan()
    registrar = FakeRegistrar(fail_after=3)
    with pytest.raises(RegistrationError, match="chunk 3"):
        allocate(plan, device="cpu", pin=True, register_chunk_bytes=4 * 2**20,
                 registrar=registrar, prefault_threads=1)
    assert registrar.registered == {}
    assert registrar.base is not None
    assert plan.host_pool is not None
    assert not mapped(registrar.base, plan.host_pool.size)


def test_a_forgotten_pools_object_unpins_when_collected() -> None:
    registrar = FakeRegistrar()
    pools: Pools | None = allocate(small_plan(), device="cpu", pin=True, registrar=registrar,
                                   prefault_threads=0)
    assert registrar.registered
    del pools
    gc.collect()
    assert registrar.registered == {}


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_pinning_for_real() -> None:
    with allocate(small_plan(), device="cuda", pin=True, register_chunk_bytes=8 * 2**20) as pools:
        assert pools.host is not None
        assert pools.host.is_pinned()
        assert len(pools.chunks) > 1


def test_a_failed_unpin_keeps_the_mapping() -> None:
    registrar = FakeRegistrar()
    pools = allocate(small_plan(), device="cpu", pin=True, registrar=registrar,
                     prefault_threads=0)
    host = pools.host
    assert host is not None
    address, size = host.data_ptr(), host.numel()
    del host
    registrar.fail_unregister = set(registrar.registered)
    with pytest.raises(RegistrationError, match="cudaHostUnregister failed for 1 host pool"):
        pools.release()
    # Pages the GPU may still reach are never unmapped: the buffer is kept for the life of the
    # process, even once nothing else refers to it. The pools are released all the same.
    assert pools.released
    gc.collect()
    assert mapped(address, size)
    buffer, _ = STRANDED.pop()
    assert isinstance(buffer, HostBuffer)
    assert buffer.address == address
    buffer.unmap()  # the test's own cleanup: the fake driver holds nothing
    assert not mapped(address, size)


class RecordingCudart:
    """Stands in for torch's libcudart bindings: each call answers `code` and is recorded."""

    def __init__(self, code: int) -> None:
        self.code = code
        self.calls: list[str] = []

    def cudaHostRegister(self, address: int, nbytes: int, flags: int) -> int:
        self.calls.append("register")
        return self.code

    def cudaHostUnregister(self, address: int) -> int:
        self.calls.append("unregister")
        return self.code


@pytest.mark.parametrize(("code", "read"), [(0, False), (712, True)])
def test_a_failed_cuda_call_leaves_no_last_error_behind(
    monkeypatch: pytest.MonkeyPatch, code: int, read: bool
) -> None:
    """A handled failure must not resurface in the engine's next CUDA call, which is what
    torch does with an unread "last error" (seen on an H200)."""
    from contextlib import nullcontext

    from hisparse_plan.torch.hostmem import registration

    cudart = RecordingCudart(code)
    monkeypatch.setattr(registration, "_cudart", lambda: cudart)
    monkeypatch.setattr(registration, "_clear_last_error",
                        lambda: cudart.calls.append("last error read"))
    monkeypatch.setattr(torch.cuda, "device", lambda index: nullcontext())
    registrar = registration.CudaRegistrar(0)
    assert registrar.register(BASE, PAGE) == code
    assert registrar.unregister(BASE) == code
    expected = ["register", "last error read", "unregister", "last error read"] if read else [
        "register", "unregister"]
    assert cudart.calls == expected
