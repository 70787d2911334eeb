"""`allocate`: pools sized and placed exactly as planned, refusals before memory is touched."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

pytest.importorskip("torch")  # the backend is an extra: skip without it

import hisparse_plan as hp
from hisparse_plan.torch import (
    BackendError,
    HostMemory,
    HostMemoryError,
    Pools,
    UnsoundPlanError,
    allocate,
    available_host_memory,
)
from hisparse_plan.torch.hostmem.mapping import HostBuffer
from hisparse_plan.torch.vllm import pools as pools_module
from support.torch_support import golden_plan, shrunk_plan, small_plan, tampered, torch

NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA refusals")


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_pools_have_exactly_the_planned_bytes() -> None:
    plan = small_plan()
    assert plan.host_pool is not None
    with allocate(plan, device="cpu", pin=False) as pools:
        host, device = pools.host, pools.device
        assert host is not None
        assert (host.dtype, host.device.type, host.dim()) == (torch.uint8, "cpu", 1)
        assert host.numel() == plan.host_pool.size == 130 * 294912
        # Never rounded to a power of two: the storage is the pool, to the byte.
        assert host.untyped_storage().nbytes() == plan.host_pool.size
        assert host.data_ptr() % 4096 == 0
        assert host.storage_offset() == 0
        assert (device.dtype, device.device.type, device.numel()) == (
            torch.uint8, "cpu", plan.device_pool.size)
        assert not pools.pinned
        assert pools.chunks == ()


def test_prefault_commits_the_pool_and_release_returns_it() -> None:
    plan = small_plan()
    assert plan.host_pool is not None
    size = plan.host_pool.size
    before = rss_bytes()
    pools = allocate(plan, device="cpu", pin=False, prefault_threads=3)
    grown = rss_bytes() - before
    assert grown >= 0.9 * size
    pools.release()
    assert rss_bytes() - before < 0.5 * size


def test_without_prefault_pages_stay_uncommitted() -> None:
    plan = small_plan()
    assert plan.host_pool is not None
    before = rss_bytes()
    with allocate(plan, device="cpu", pin=False, prefault_threads=0):
        assert rss_bytes() - before < 0.5 * plan.host_pool.size


def test_prefault_without_populate_touches_every_page(monkeypatch: pytest.MonkeyPatch) -> None:
    # Kernels before 5.14 lack MADV_POPULATE_WRITE: the fallback writes a byte per page.
    monkeypatch.setattr("hisparse_plan.torch.hostmem.mapping._populate_supported",
                        lambda address: False)
    buffer = HostBuffer(3 * 2**20 + 100, huge_pages=False)
    before = rss_bytes()
    buffer.prefault(2)
    assert rss_bytes() - before >= 3 * 2**20
    buffer.release()


def test_release_is_idempotent_and_final() -> None:
    pools = allocate(small_plan(), device="cpu", pin=False, prefault_threads=0)
    pools.release()
    pools.release()
    assert pools.released
    with pytest.raises(BackendError, match="released"):
        _ = pools.device
    with pytest.raises(BackendError, match="released"):
        pools.views()


def test_views_taken_before_release_stay_safe() -> None:
    with allocate(small_plan(), device="cpu", pin=False) as pools:
        view = next(iter(pools.views().values()))
        view[0].fill_(1)
    # The pages went back to the kernel, but the mapping lives while the view does.
    assert int(view[0].float().sum()) == 0


def test_host_pool_above_95_percent_of_ram_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = small_plan()
    assert plan.host_pool is not None
    size = plan.host_pool.size
    monkeypatch.setattr(pools_module, "available_host_memory",
                        lambda: HostMemory(size, "MemAvailable (test)"))

    def untouchable(*args: object, **kwargs: object) -> None:
        raise AssertionError("memory was mapped before the refusal")

    monkeypatch.setattr(pools_module, "HostBuffer", untouchable)
    with pytest.raises(HostMemoryError) as caught:
        allocate(plan, device="cpu", pin=False)
    error = caught.value
    assert (error.requested, error.available) == (size + plan.device_pool.size, size)
    message = str(error)
    assert message.startswith("the host and CPU device pools: ")
    assert f"({size} bytes) of host RAM is available (MemAvailable (test))" in message
    assert "expected at most 95%" in message


def test_host_pool_at_95_percent_fits(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = small_plan()
    assert plan.host_pool is not None
    needed = plan.host_pool.size + plan.device_pool.size
    monkeypatch.setattr(pools_module, "available_host_memory",
                        lambda: HostMemory(int(needed / 0.95) + 64, "test"))
    allocate(plan, device="cpu", pin=False, prefault_threads=0).release()


def test_a_64_gib_pool_is_refused_here_or_fits() -> None:
    plan = golden_plan("deepseek_v32_fp8")
    assert plan.host_pool is not None
    if plan.host_pool.size <= 0.95 * available_host_memory().available:
        pytest.skip("this machine has the RAM for a 64 GiB host pool")
    # On the CPU the device pool (60 GiB) counts too.
    with pytest.raises(HostMemoryError, match=r"124\.00 GiB \(133141592064 bytes\) asked for"):
        allocate(plan, device="cpu", pin=False)


def test_plan_without_host_pool_gives_none() -> None:
    plan = shrunk_plan("regular_llama3_8b_bf16")
    assert plan.host_pool is None
    with allocate(plan, device="cpu", pin=False) as pools:
        assert pools.host is None
        views = pools.views()
        assert views
        assert all(view.device.type == "cpu" for view in views.values())


def test_tensors_disagreeing_on_pool_size_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = small_plan()

    def grow(dumped: dict[str, object]) -> None:
        tensors = dumped["tensors"]
        assert isinstance(tensors, list)
        tensors[1]["size"] += 1

    bad = tampered(plan, grow)
    with pytest.raises(UnsoundPlanError, match=r"check_plan does not prove sound"):
        allocate(bad, device="cpu", pin=False)
    # The backend's own guard, behind check_plan, says the same.
    monkeypatch.setattr(pools_module, "check_sound", lambda plan: None)
    with pytest.raises(BackendError, match=rf"tensors\[1\] .* expected {plan.device_pool.size}, "
                                           r"the plan's device_pool.size"):
        allocate(bad, device="cpu", pin=False)


@pytest.mark.parametrize("device", ["tpu", "cuda:x", "cpu:0", "", "CUDA"])
def test_unknown_devices_are_refused(device: str) -> None:
    with pytest.raises(BackendError, match="expected 'cpu', 'cuda', 'cuda:N' or 'meta'"):
        allocate(small_plan(), device=device, pin=False)


@NO_CUDA
@pytest.mark.parametrize("device", ["cuda", "cuda:0"])
def test_cuda_without_cuda_is_an_error(device: str) -> None:
    with pytest.raises(BackendError, match=r"CUDA is not available.*pass device='cpu'"):
        allocate(small_plan(), device=device, pin=False)


@NO_CUDA
def test_pinning_without_cuda_is_an_error() -> None:
    with pytest.raises(BackendError, match=r"pin=True needs CUDA.*pass pin=False"):
        allocate(small_plan(), device="cpu", pin=True)


def test_pinning_meta_pools_is_an_error() -> None:
    with pytest.raises(BackendError, match="meta pools hold no memory"):
        allocate(small_plan(), device="meta", pin=True)


def test_negative_prefault_threads_are_refused() -> None:
    with pytest.raises(BackendError, match="prefault_threads is -1"):
        allocate(small_plan(), device="cpu", pin=False, prefault_threads=-1)


def test_backend_errors_stand_beside_plan_errors() -> None:
    assert issubclass(BackendError, hp.HisparsePlanError)
    assert not issubclass(BackendError, hp.PlanError)
    assert not issubclass(hp.PlanError, BackendError)


def test_meta_pools_have_full_sizes_and_no_memory() -> None:
    plan = golden_plan("deepseek_v32_fp8")
    assert plan.host_pool is not None
    before = rss_bytes()
    with allocate(plan, device="meta", pin=False) as pools:
        assert isinstance(pools, Pools)
        assert pools.host is not None
        assert (pools.host.device.type, pools.host.numel()) == ("meta", plan.host_pool.size)
        assert (pools.device.device.type, pools.device.numel()) == ("meta", 64424196096)
    assert rss_bytes() - before < 2**30


class TestAvailableHostMemory:
    def write(self, root: Path, files: dict[str, str]) -> None:
        for name, text in files.items():
            path = root / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)

    def test_meminfo_alone(self, tmp_path: Path) -> None:
        self.write(tmp_path, {"meminfo": "MemTotal: 100 kB\nMemAvailable:   2048 kB\n"})
        memory = available_host_memory(tmp_path / "meminfo", tmp_path / "none", tmp_path)
        assert memory.available == 2048 * 1024
        assert "MemAvailable" in memory.source

    def test_a_parent_cgroup_limit_counts(self, tmp_path: Path) -> None:
        gib = 2**30
        self.write(tmp_path, {
            "meminfo": f"MemAvailable: {64 * gib // 1024} kB\n",
            "self_cgroup": "0::/pod/app\n",
            "cg/pod/memory.max": f"{8 * gib}\n",
            "cg/pod/memory.current": f"{3 * gib}\n",
            "cg/pod/memory.stat": f"anon 1\ninactive_file {gib}\n",
            "cg/pod/app/memory.max": "max\n",
            "cg/pod/app/memory.current": f"{3 * gib}\n",
        })
        memory = available_host_memory(tmp_path / "meminfo", tmp_path / "self_cgroup",
                                       tmp_path / "cg")
        # 8 GiB limit - 3 GiB used + 1 GiB of reclaimable page cache.
        assert memory.available == 6 * gib
        assert memory.source.startswith("cgroup /pod headroom")

    def test_cgroup_v1(self, tmp_path: Path) -> None:
        self.write(tmp_path, {
            "self_cgroup": "4:memory:/job\n3:cpu:/job\n",
            "cg/memory/job/memory.limit_in_bytes": "1000000\n",
            "cg/memory/job/memory.usage_in_bytes": "400000\n",
        })
        memory = available_host_memory(tmp_path / "none", tmp_path / "self_cgroup",
                                       tmp_path / "cg")
        assert memory.available == 600000

    def test_nothing_readable_means_unbounded(self, tmp_path: Path) -> None:
        memory = available_host_memory(tmp_path / "a", tmp_path / "b", tmp_path)
        assert memory.available >= 2**60

    def test_this_machine(self) -> None:
        memory = available_host_memory()
        assert memory.available > 0


def test_plans_are_not_changed_by_allocation() -> None:
    plan = small_plan()
    before = copy.deepcopy(plan.model_dump(mode="json"))
    with allocate(plan, device="cpu", pin=False, prefault_threads=0) as pools:
        pools.views()
    assert plan.model_dump(mode="json") == before
