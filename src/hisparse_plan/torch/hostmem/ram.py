"""How much host RAM a pool may take, decided before a single page is touched.

A process that maps more than the machine can back is not refused at allocation: Linux
overcommits, and the OOM killer strikes later, when an engine first writes the far end of its
cache. So the pool is compared with what is really there: `MemAvailable`, and inside a container
the headroom of every cgroup above the process (a pod's limit is often far below the host's RAM).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from hisparse_plan.torch.errors import HostMemoryError

HOST_RAM_FRACTION = 0.95
"""Leave 5% for the engine itself: a pool at 100% of MemAvailable starves everything else."""


_UNLIMITED = 2**60
"""cgroup v1 reports "no limit" as a huge number near 2**63; anything above this is no limit."""


@dataclass(frozen=True, slots=True)
class HostMemory:
    """The bytes a new allocation can take, and where that figure came from."""

    available: int
    source: str


def gib(nbytes: int) -> str:
    """`nbytes` for a message: GiB to two places, then the exact bytes."""
    return f"{nbytes / 2**30:.2f} GiB ({nbytes} bytes)"


HOST_POOL_ADVICE = "Lower hisparse.host_pool_gib or free host memory"
DEVICE_POOL_ADVICE = (
    "Lower device.available_bytes (--gpu-mem), verify on --device meta or cuda, or free host "
    "memory"
)
"""What to change when only a CPU device pool (no host pool) does not fit."""


def check_host_fits(
    requested: int,
    memory: HostMemory,
    *,
    what: str = "the host pool",
    advice: str = HOST_POOL_ADVICE,
) -> None:
    """Refuse `requested` bytes above HOST_RAM_FRACTION of what is available; `advice` says
    what to lower (a plan without a host pool has no host_pool_gib to lower)."""
    allowed = int(memory.available * HOST_RAM_FRACTION)
    if requested > allowed:
        raise HostMemoryError(
            f"{what}: {gib(requested)} asked for, but only {gib(memory.available)} of host RAM "
            f"is available ({memory.source}); expected at most {HOST_RAM_FRACTION:.0%} of that, "
            f"{gib(allowed)}. {advice}",
            requested=requested,
            available=memory.available,
        )


def available_host_memory(
    meminfo: Path = Path("/proc/meminfo"),
    cgroup_file: Path = Path("/proc/self/cgroup"),
    cgroup_root: Path = Path("/sys/fs/cgroup"),
) -> HostMemory:
    """The smallest of MemAvailable and every enclosing cgroup's headroom.

    Sources that cannot be read are skipped; when none can, the figure is unbounded, since
    refusing every pool on an unknown system would be worse than trusting the caller.
    """
    candidates: list[HostMemory] = []
    mem_available = _meminfo_available(meminfo)
    if mem_available is not None:
        candidates.append(HostMemory(mem_available, f"MemAvailable {gib(mem_available)}"))
    for path, headroom in _cgroup_headrooms(cgroup_file, cgroup_root):
        candidates.append(HostMemory(headroom, f"cgroup {path} headroom {gib(headroom)}"))
    if not candidates:
        return HostMemory(_UNLIMITED, "no /proc/meminfo or cgroup limit readable")
    return min(candidates, key=lambda memory: memory.available)


def _meminfo_available(meminfo: Path) -> int | None:
    try:
        text = meminfo.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key == "MemAvailable":
            fields = rest.split()
            if fields and fields[0].isdigit():
                scale = 1024 if fields[1:2] == ["kB"] else 1
                return int(fields[0]) * scale
    return None


def _cgroup_headrooms(cgroup_file: Path, cgroup_root: Path) -> Iterator[tuple[str, int]]:
    """Headroom of each limited cgroup from the process's own up to the root (v2, then v1)."""
    try:
        lines = cgroup_file.read_text().splitlines()
    except OSError:
        return
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            yield from _v2_headrooms(cgroup_root, path)
        elif "memory" in controllers.split(","):
            yield from _v1_headroom(cgroup_root / "memory", path)


def _v2_headrooms(root: Path, path: str) -> Iterator[tuple[str, int]]:
    # A child with "max" still lives inside its parent's limit, so every level counts.
    parts = [part for part in path.strip("/").split("/") if part]
    for depth in range(len(parts), -1, -1):
        relative = "/".join(parts[:depth])
        directory = root / relative if relative else root
        limit = _read_int(directory / "memory.max")
        usage = _read_int(directory / "memory.current")
        if limit is None or usage is None or limit >= _UNLIMITED:
            continue
        reclaimable = _stat_field(directory / "memory.stat", "inactive_file")
        yield "/" + relative, max(0, limit - usage + reclaimable)


def _v1_headroom(root: Path, path: str) -> Iterator[tuple[str, int]]:
    for directory in (root / path.strip("/"), root):
        limit = _read_int(directory / "memory.limit_in_bytes")
        usage = _read_int(directory / "memory.usage_in_bytes")
        if limit is None or usage is None or limit >= _UNLIMITED:
            continue
        reclaimable = _stat_field(directory / "memory.stat", "total_inactive_file")
        yield str(directory), max(0, limit - usage + reclaimable)
        return


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _stat_field(path: Path, key: str) -> int:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return 0
    for line in lines:
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return 0
