"""NUMA placement: the GPU's node from a (fake) sysfs tree, mbind on the untouched mapping,
clear reasons where it cannot be done, and an error only for a node asked for explicitly."""

from __future__ import annotations

import logging
import mmap
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("torch")  # the backend is an extra: skip without it

from hisparse_plan.torch import BackendError, allocate
from hisparse_plan.torch.hostmem import numa as numa_module
from hisparse_plan.torch.hostmem.mapping import HostBuffer
from hisparse_plan.torch.hostmem.numa import (
    NumaPlacement,
    memory_policy,
    normalize_bus_id,
    page_node,
    pci_numa_node,
    place,
)
from support.torch_support import numa_binding_works, small_plan

BUS = "0000:3b:00.0"
needs_node_0 = pytest.mark.skipif(
    not numa_binding_works(), reason="this process cannot bind memory to NUMA node 0 (no node "
    "0, or a sandbox that refuses mbind)")


def fake_sysfs(root: Path, node: str | None, bus: str = BUS) -> Path:
    device = root / "bus/pci/devices" / bus
    device.mkdir(parents=True)
    if node is not None:
        (device / "numa_node").write_text(f"{node}\n")
    (root / "devices/system/node").mkdir(parents=True)
    (root / "devices/system/node/online").write_text("0\n")
    return root


@pytest.fixture
def buffer() -> Iterator[HostBuffer]:
    mapped = HostBuffer(4 * mmap.PAGESIZE, huge_pages=False)
    yield mapped
    mapped.unmap()


@pytest.mark.parametrize(("text", "expected"), [
    ("00000000:3B:00.0", BUS), ("0000:3b:00.0", BUS), ("3b:00.0", BUS),
    ("0001:c1:00.1", "0001:c1:00.1"), ("3b:00", None), ("GPU-1234", None), ("", None),
])
def test_bus_ids_are_spelled_as_sysfs_does(text: str, expected: str | None) -> None:
    assert normalize_bus_id(text) == expected


def test_the_node_comes_from_sysfs(tmp_path: Path) -> None:
    assert pci_numa_node(BUS, fake_sysfs(tmp_path, "1"))[0] == 1


@pytest.mark.parametrize(("node", "why"), [
    ("-1", "the kernel does not know the node"),
    (None, "cannot read"),
    ("zero", "expected a node number"),
])
def test_an_unknown_node_says_why(tmp_path: Path, node: str | None, why: str) -> None:
    found, reason = pci_numa_node(BUS, fake_sysfs(tmp_path, node))
    assert found is None
    assert why in reason


@needs_node_0
def test_the_gpus_node_is_preferred(tmp_path: Path, buffer: HostBuffer) -> None:
    placed = place(buffer.address, buffer.nbytes, requested=None, gpu_index=0,
                   sysfs_root=fake_sysfs(tmp_path, "0"), bus_id_of=lambda index: BUS)
    assert (placed.node, placed.policy) == (0, "MPOL_PREFERRED")
    assert placed.describe().startswith("NUMA node: 0 (MPOL_PREFERRED, the node of PCI device")
    assert memory_policy(buffer.address) == ("MPOL_PREFERRED", [0])
    buffer.prefault(1)
    assert page_node(buffer.address) == 0


@pytest.mark.parametrize(("node", "bus", "why"), [
    ("-1", BUS, "the kernel does not know the node of 0000:3b:00.0"),
    (None, BUS, "cannot read"),
    ("999", BUS, "cuda:0 is on node 999, but mbind failed: "),
    ("5000", BUS, "cuda:0 is on node 5000, but node 5000 is outside 0..1023"),
    ("0", None, "torch does not report the PCI bus id of cuda:0"),
])
def test_where_the_gpus_node_cannot_be_used_a_warning_says_why(
    tmp_path: Path, buffer: HostBuffer, caplog: pytest.LogCaptureFixture,
    node: str | None, bus: str | None, why: str,
) -> None:
    with caplog.at_level(logging.WARNING, logger="hisparse_plan"):
        placed = place(buffer.address, buffer.nbytes, requested=None, gpu_index=0,
                       sysfs_root=fake_sysfs(tmp_path, node), bus_id_of=lambda index: bus)
    assert placed.node is None
    assert placed.describe().startswith("NUMA node: unknown/not bound (")
    assert why in placed.describe()
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert why in caplog.records[0].getMessage()
    assert memory_policy(buffer.address) in (("MPOL_DEFAULT", []), None)


@pytest.mark.skipif(Path("/sys/devices/system/node/node1").exists(), reason="has node 1")
def test_a_node_the_kernel_refuses_is_a_warning(
    tmp_path: Path, buffer: HostBuffer, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="hisparse_plan"):
        placed = place(buffer.address, buffer.nbytes, requested=None, gpu_index=0,
                       sysfs_root=fake_sysfs(tmp_path, "1"), bus_id_of=lambda index: BUS)
    assert placed.node is None
    assert "cuda:0 is on node 1, but mbind failed" in placed.reason


def test_without_mbind_nothing_fails(
    tmp_path: Path, buffer: HostBuffer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(numa_module, "_SYSCALL", None)
    placed = place(buffer.address, buffer.nbytes, requested=None, gpu_index=0,
                   sysfs_root=fake_sysfs(tmp_path, "0"), bus_id_of=lambda index: BUS)
    assert placed.node is None
    assert "mbind is not available on this platform" in placed.reason
    with pytest.raises(BackendError, match=r"numa_node=0 was asked for.*mbind is not available"):
        place(buffer.address, buffer.nbytes, requested=0, gpu_index=None)


@needs_node_0
def test_an_explicit_node_is_bound(buffer: HostBuffer) -> None:
    placed = place(buffer.address, buffer.nbytes, requested=0, gpu_index=None)
    assert placed == NumaPlacement(0, "MPOL_BIND", "asked for by the caller")
    assert memory_policy(buffer.address) == ("MPOL_BIND", [0])


@pytest.mark.parametrize(("node", "why"), [
    (5000, "node 5000 is outside 0..1023"), (999, "mbind failed: ")])
def test_an_explicit_node_that_cannot_be_bound_raises(
    tmp_path: Path, buffer: HostBuffer, node: int, why: str
) -> None:
    with pytest.raises(BackendError) as caught:
        place(buffer.address, buffer.nbytes, requested=node, gpu_index=None,
              sysfs_root=fake_sysfs(tmp_path, "0"))
    message = str(caught.value)
    assert message.startswith(
        f"numa_node={node} was asked for, but the host pool cannot be bound there: {why}")
    assert message.endswith("(online nodes: 0); pass another node, or numa_node=None to follow "
                            "the GPU where possible")


def test_pools_on_the_cpu_follow_no_gpu(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="hisparse_plan"), \
            allocate(small_plan(), device="cpu", pin=False, prefault_threads=0) as pools:
        assert pools.numa is not None
        assert pools.numa.node is None
        summary = pools.summary()
    assert ("NUMA node: unknown/not bound (the device pool is not on a GPU, so there is no GPU "
            "node to follow)") in summary
    # Nothing to follow is no fault: no warning for a CPU-only allocation.
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


@needs_node_0
def test_allocate_binds_an_explicit_node() -> None:
    with allocate(small_plan(), device="cpu", pin=False, numa_node=0) as pools:
        host = pools.host
        assert host is not None
        assert page_node(host.data_ptr() + host.numel() - 1) == 0
        assert "NUMA node: 0 (MPOL_BIND, asked for by the caller)" in pools.summary()


def test_allocate_refuses_a_negative_node() -> None:
    with pytest.raises(BackendError, match="numa_node is -1"):
        allocate(small_plan(), device="cpu", pin=False, numa_node=-1)


def test_allocate_raises_for_an_explicit_node_it_cannot_bind() -> None:
    with pytest.raises(BackendError, match="numa_node=999 was asked for"):
        allocate(small_plan(), device="cpu", pin=False, numa_node=999)
