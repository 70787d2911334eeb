"""Placing the host pool on the NUMA node of the GPU it serves.

On a two-socket server a host-to-device copy from the far socket's memory crosses the socket
link and runs at a fraction of the PCIe rate, so the pool belongs on the GPU's own node. The
kernel says which node a PCI device hangs off in `/sys/bus/pci/devices/<bus id>/numa_node`
(-1 when it does not know), and mbind(2) on the still-untouched mapping decides where its pages
will be allocated when prefaulting touches them.

The node the GPU implies is a preference (MPOL_PREFERRED: a full node spills to another rather
than failing), and any reason it cannot be applied is reported, never fatal. A node the caller
names explicitly is a demand (MPOL_BIND), and failing to apply it raises.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from hisparse_plan.torch.errors import BackendError
from hisparse_plan.torch.hostmem.tasks import LOG

SYSFS_ROOT = Path("/sys")
"""Read at call time, so tests can point it at a fake tree."""

MPOL_PREFERRED = 1
MPOL_BIND = 2
POLICY_NAMES = {0: "MPOL_DEFAULT", MPOL_PREFERRED: "MPOL_PREFERRED", MPOL_BIND: "MPOL_BIND",
                3: "MPOL_INTERLEAVE", 4: "MPOL_LOCAL"}
_MPOL_F_NODE = 1
_MPOL_F_ADDR = 2
_MAX_NODES = 1024
"""Size of the node masks passed to the kernel (its MAX_NUMNODES is at most 1024)."""

_SYSCALLS = {"x86_64": (237, 239), "aarch64": (235, 236), "ppc64le": (259, 260)}
"""(mbind, get_mempolicy) numbers; glibc exports neither, libnuma is not always installed."""

_BUS_ID = re.compile(r"(?:([0-9a-fA-F]{4,8}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])")


@dataclass(frozen=True, slots=True)
class NumaPlacement:
    """Where the host pool's pages go: `node` with `policy`, or nowhere in particular (node
    None) and `reason` says why; when bound, `reason` says where the node came from."""

    node: int | None
    policy: str | None
    reason: str

    def describe(self) -> str:
        if self.node is None:
            return f"NUMA node: unknown/not bound ({self.reason})"
        return f"NUMA node: {self.node} ({self.policy or 'not bound by this process'}, " \
               f"{self.reason})"


def normalize_bus_id(text: str) -> str | None:
    """sysfs's spelling of a PCI bus id ("0000:3b:00.0") from nvidia-smi's
    ("00000000:3B:00.0") or torch's; None when `text` is not a bus id."""
    match = _BUS_ID.fullmatch(text.strip())
    if match is None:
        return None
    domain, bus, device, function = match.groups()
    return f"{int(domain or '0', 16):04x}:{bus.lower()}:{device.lower()}.{function}"


def pci_bus_id(device_index: int) -> str | None:
    """The bus id of CUDA device `device_index` from torch's device properties, or None where
    torch does not report it."""
    properties = torch.cuda.get_device_properties(device_index)
    fields = [getattr(properties, name, None)
              for name in ("pci_domain_id", "pci_bus_id", "pci_device_id")]
    if not all(isinstance(value, int) for value in fields):
        return None
    domain, bus, device = fields
    return f"{domain:04x}:{bus:02x}:{device:02x}.0"


def pci_numa_node(bus_id: str, sysfs_root: Path | None = None) -> tuple[int | None, str]:
    """The NUMA node sysfs gives for PCI device `bus_id`, or None and why not."""
    root = SYSFS_ROOT if sysfs_root is None else sysfs_root
    path = root / "bus/pci/devices" / bus_id / "numa_node"
    try:
        text = path.read_text().strip()
    except OSError as error:
        return None, f"cannot read {path}: {error.strerror or error}"
    if not re.fullmatch(r"-?\d+", text):
        return None, f"{path} holds {text!r}; expected a node number"
    node = int(text)
    if node < 0:
        return None, (f"{path} is {node}: the kernel does not know the node of {bus_id} "
                      "(a single-node machine, or firmware that does not say)")
    return node, f"the node of PCI device {bus_id}, from {path}"


def online_nodes(sysfs_root: Path | None = None) -> str:
    """The kernel's list of online nodes ("0-1"), or "unknown"."""
    root = SYSFS_ROOT if sysfs_root is None else sysfs_root
    try:
        return (root / "devices/system/node/online").read_text().strip() or "unknown"
    except OSError:
        return "unknown"


def _syscall() -> tuple[Callable[..., int], tuple[int, int]] | None:
    numbers = _SYSCALLS.get(platform.machine())
    if numbers is None or not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    function = libc.syscall
    function.restype = ctypes.c_long
    return function, numbers


_SYSCALL = _syscall()


def _mask(node: int) -> ctypes.Array[ctypes.c_ulong]:
    bits = 8 * ctypes.sizeof(ctypes.c_ulong)
    mask = (ctypes.c_ulong * (_MAX_NODES // bits))()
    mask[node // bits] = 1 << (node % bits)
    return mask


def mbind(address: int, nbytes: int, node: int, policy: int) -> str | None:
    """Bind [address, address + nbytes) to `node`; None on success, else why it failed."""
    if _SYSCALL is None:
        return f"mbind is not available on this platform ({platform.machine()})"
    if not 0 <= node < _MAX_NODES:
        return f"node {node} is outside 0..{_MAX_NODES - 1}"
    call, (number, _) = _SYSCALL
    result = call(ctypes.c_long(number), ctypes.c_void_p(address), ctypes.c_ulong(nbytes),
                  ctypes.c_int(policy), _mask(node), ctypes.c_ulong(_MAX_NODES + 1),
                  ctypes.c_uint(0))
    return None if result == 0 else f"mbind failed: {os.strerror(ctypes.get_errno())}"


def memory_policy(address: int) -> tuple[str, list[int]] | None:
    """The policy governing the page at `address` and its nodes, or None where unknown."""
    if _SYSCALL is None:
        return None
    call, (_, number) = _SYSCALL
    mode = ctypes.c_int(-1)
    mask = (ctypes.c_ulong * (_MAX_NODES // (8 * ctypes.sizeof(ctypes.c_ulong))))()
    if call(ctypes.c_long(number), ctypes.byref(mode), mask, ctypes.c_ulong(_MAX_NODES + 1),
            ctypes.c_void_p(address), ctypes.c_ulong(_MPOL_F_ADDR)) != 0:
        return None
    bits = 8 * ctypes.sizeof(ctypes.c_ulong)
    nodes = [i for i in range(_MAX_NODES) if mask[i // bits] >> (i % bits) & 1]
    return POLICY_NAMES.get(mode.value, str(mode.value)), nodes


def page_node(address: int) -> int | None:
    """The node the (already faulted) page at `address` lives on, or None where unknown."""
    if _SYSCALL is None:
        return None
    call, (_, number) = _SYSCALL
    node = ctypes.c_int(-1)
    result = call(ctypes.c_long(number), ctypes.byref(node), None, ctypes.c_ulong(0),
                  ctypes.c_void_p(address), ctypes.c_ulong(_MPOL_F_NODE | _MPOL_F_ADDR))
    return node.value if result == 0 and node.value >= 0 else None


def place(
    address: int,
    nbytes: int,
    *,
    requested: int | None,
    gpu_index: int | None,
    sysfs_root: Path | None = None,
    bus_id_of: Callable[[int], str | None] = pci_bus_id,
) -> NumaPlacement:
    """Bind the untouched mapping to `requested` (MPOL_BIND; raise if impossible) or, when
    None, to the node of CUDA device `gpu_index` (MPOL_PREFERRED; log a WARNING and leave it
    unbound if impossible). `gpu_index` None means the pools serve no GPU: nothing to follow."""
    if requested is not None:
        why = mbind(address, nbytes, requested, MPOL_BIND)
        if why is not None:
            raise BackendError(
                f"numa_node={requested} was asked for, but the host pool cannot be bound "
                f"there: {why} (online nodes: {online_nodes(sysfs_root)}); pass another "
                "node, or numa_node=None to follow the GPU where possible"
            )
        placed = NumaPlacement(requested, "MPOL_BIND", "asked for by the caller")
        LOG.debug("host pool bound to NUMA node %d (MPOL_BIND, asked for)", requested)
        return placed
    if gpu_index is None:
        return _unbound("the device pool is not on a GPU, so there is no GPU node to follow",
                        logging.DEBUG)
    bus_id = bus_id_of(gpu_index)
    if bus_id is None:
        return _unbound(f"torch does not report the PCI bus id of cuda:{gpu_index}",
                        logging.WARNING)
    node, why = pci_numa_node(bus_id, sysfs_root)
    if node is None:
        return _unbound(f"cuda:{gpu_index}: {why}", logging.WARNING)
    failed = mbind(address, nbytes, node, MPOL_PREFERRED)
    if failed is not None:
        return _unbound(f"cuda:{gpu_index} is on node {node}, but {failed}", logging.WARNING)
    LOG.debug("host pool prefers NUMA node %d, %s", node, why)
    return NumaPlacement(node, "MPOL_PREFERRED", f"{why}, serving cuda:{gpu_index}")


def _unbound(reason: str, level: int) -> NumaPlacement:
    LOG.log(level, "host pool NUMA placement: not bound (%s)", reason)
    return NumaPlacement(None, None, reason)


def attached_placement(address: int, requested: int | None) -> NumaPlacement:
    """Where the creating process put a shared pool this process attached (its policy and the
    node of its first page); a node asked for explicitly must be that one."""
    node = page_node(address)
    if requested is not None and node != requested:
        raise BackendError(
            f"numa_node={requested} was asked for, but the shared host pool this process "
            f"attached lives on node {'unknown' if node is None else node}, where the process "
            "that created it placed it; ask every rank for the same node"
        )
    if node is None:
        return NumaPlacement(None, None, "attached a shared pool; its node cannot be read")
    policy = memory_policy(address)
    if policy is None or policy[0] == "MPOL_DEFAULT":
        return NumaPlacement(node, None, "where the kernel put the pages: the process that "
                                         "created the shared pool bound nothing")
    return NumaPlacement(node, policy[0], "set by the process that created the shared pool")

