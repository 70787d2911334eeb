"""The NIXL executor: posts a transfer program with NIXL (`nixl-cu12`, 1.5.1), the source
side writing into the destination's registered regions. Each side registers every region of
its ranks once; the rows become NIXL descriptors (a row whose chunks follow one another on
both sides is one descriptor, any other row one per chunk). NIXL is imported when an
endpoint is made: the package never imports this module."""

from __future__ import annotations

import importlib
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from hisparse_plan.exchange.transfer.errors import TransferCheckError
from hisparse_plan.exchange.transfer.program.transfer_program import TransferProgram, is_one_copy

Addresses = Mapping[tuple[int, str], tuple[int, int]]
"""(rank, region) -> (base address, bytes) of a region's memory in this process."""


@dataclass
class Endpoint:
    """One process's NIXL agent with its ranks' regions registered."""

    agent: Any
    addresses: dict[tuple[int, str], tuple[int, int]]
    mem_type: str
    device: int

    @property
    def metadata(self) -> bytes:
        """What the other side's agent needs to reach this one (add_remote_agent)."""
        data: bytes = self.agent.get_agent_metadata()
        return data


def endpoint(name: str, addresses: Addresses, mem_type: str = "DRAM", device: int = 0, *,
             progress_thread: bool = True) -> Endpoint:
    """A NIXL agent over UCX with every region registered once (DRAM, or VRAM of `device`).
    Without `progress_thread` the agent makes progress only when polled (post() polls until
    done): an agent that only initiates then does not contend with its own thread for the
    locks a post takes (nixl-cu12 1.5.1 on 2 loaded CPUs: make_prepped_xfer of 158,720
    copies 27 ms against 84 ms, medians by the wall clock)."""
    api = importlib.import_module("nixl_cu12._api")  # optional: never a dependency
    agent = api.nixl_agent(name, api.nixl_agent_config(enable_prog_thread=progress_thread,
                                                       backends=["UCX"]))
    regions = [(base, size, device, "") for base, size in addresses.values()]
    agent.register_memory(regions, mem_type)
    return Endpoint(agent, dict(addresses), mem_type, device)


def descriptors(program: TransferProgram, source: Addresses, destination: Addresses
                ) -> tuple[NDArray[np.uint64], NDArray[np.uint64]]:
    """The program's (address, length, device) descriptors on each side, one per contiguous
    copy, every one checked to lie inside its region."""
    rows = program.rows
    columns = np.array([[
        row.length, row.count,
        row.src_stride if row.count > 1 else row.length,
        row.dst_stride if row.count > 1 else row.length,
        *source[(row.src_rank, row.src_region)], row.src_offset,
        *destination[(row.dst_rank, row.dst_region)], row.dst_offset,
    ] for row in rows], dtype=np.int64).reshape(-1, 10)
    length, count, src_stride, dst_stride = columns[:, 0], columns[:, 1], columns[:, 2], \
        columns[:, 3]
    for _, size, offset, stride in ((4, 5, 6, src_stride), (7, 8, 9, dst_stride)):
        end = columns[:, offset] + (count - 1) * stride + length
        if (end > columns[:, size]).any():
            bad = int(np.argmax(end > columns[:, size]))
            raise TransferCheckError(f"row {bad}: its bytes leave its region", row=bad)
    whole = np.array([is_one_copy(row) for row in rows], dtype=bool)
    chunks = np.where(whole, 1, count)
    sizes = np.where(whole, length * count, length)
    row = np.repeat(np.arange(len(rows)), chunks)
    first = np.repeat(np.cumsum(chunks) - chunks, chunks)
    index = np.arange(int(chunks.sum())) - first
    sides = []
    for base, offset, stride in ((4, 6, src_stride), (7, 9, dst_stride)):
        address = columns[row, base] + columns[row, offset] + index * stride[row]
        sides.append(np.stack([address, sizes[row], np.zeros_like(address)], axis=1)
                     .astype(np.uint64))
    return sides[0], sides[1]


def post(source: Endpoint, remote_metadata: bytes, program: TransferProgram,
         remote_addresses: Addresses, *, timeout_s: float = 60.0) -> int:
    """Write every row from `source`'s regions to the remote agent's; wait until NIXL says
    done. Returns the descriptors posted."""
    remote = source.agent.add_remote_agent(remote_metadata)
    local_descs, remote_descs = descriptors(program, source.addresses, remote_addresses)
    local_descs[:, 2] = source.device
    local = source.agent.get_xfer_descs(local_descs, source.mem_type)
    theirs = source.agent.get_xfer_descs(remote_descs, source.mem_type)
    handle = source.agent.initialize_xfer("WRITE", local, theirs, remote, b"transfer done")
    run_to_done(source, handle, timeout_s=timeout_s)
    return len(local_descs)


def run_to_done(source: Endpoint, handle: object, *, timeout_s: float) -> None:
    """Start a made transfer, poll it until NIXL says done (polling also drives an agent
    without its progress thread), and release it."""
    state = source.agent.transfer(handle)
    deadline = time.monotonic() + timeout_s
    while state == "PROC":
        if time.monotonic() > deadline:
            raise TransferCheckError(f"NIXL did not finish the transfer in {timeout_s} s")
        state = source.agent.check_xfer_state(handle)
    if state != "DONE":
        raise TransferCheckError(f"NIXL reported the transfer as {state}")
    source.agent.release_xfer_handle(handle)
