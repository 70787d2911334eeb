"""Posting phase 1 of a staged transfer with NIXL (see docs/transfer.md#staged-transfers):
each region registered once (nixl_direct's endpoint, the staging region among the
destination's); per round, the request's (slab, block) -> (slab, slot) pairs joined in numpy
into one descriptor per run of consecutive blocks wherever a slab is its whole block, so a
round posts a few descriptors per run, built per round (a prepared list would index one
entry per block and leave the joining to NIXL). The destination rearranges after NIXL's
notification (rearrange.py, or the torch backend on a GPU). NIXL is imported with
nixl_direct, never by the package."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from hisparse_plan.exchange.transfer.errors import TransferCheckError
from hisparse_plan.exchange.transfer.executors.nixl_direct import Addresses, Endpoint, run_to_done
from hisparse_plan.exchange.transfer.pattern.staged_request import (
    StagedRequest,
    StagedRound,
    StagedShape,
)
from hisparse_plan.exchange.transfer.program.transfer_program import STAGING_REGION


def run_entries(staged: StagedShape, round_: StagedRound, source: Addresses,
                destination: Addresses) -> tuple[NDArray[np.uint64], NDArray[np.uint64]]:
    """A round's phase 1 as (address, length, device) descriptors on each side: one per run
    of consecutive blocks in consecutive slots of a slab that is its whole block, else one
    per block; every one checked to lie inside its region."""
    phase = round_.phase1
    slabs = staged.slabs
    column = np.array([[s.offset, s.block_stride, s.length, s.staging_offset,
                        *source[(s.src_rank, s.src_region)],
                        *destination[(s.dst_rank, STAGING_REGION)]] for s in slabs],
                      dtype=np.int64).reshape(-1, 8)[phase.slab]
    offset, stride, length, staging = column[:, 0], column[:, 1], column[:, 2], column[:, 3]
    whole = np.array([s.length == s.block_stride for s in slabs], dtype=bool)
    starts, blocks = phase.runs(whole)
    read = offset[starts] + phase.src_ids[starts] * stride[starts]
    write = staging[starts] + phase.slot[starts] * length[starts]
    size = length[starts] * blocks
    sides = []
    for base, limit, at, what in ((column[starts, 4], column[starts, 5], read, "source"),
                                  (column[starts, 6], column[starts, 7], write, "staging")):
        if ((at < 0) | (at + size > limit)).any():
            raise TransferCheckError(f"phase 1: a slab's bytes leave its {what} region")
        sides.append(np.stack([base + at, size, np.zeros_like(size)], axis=1)
                     .astype(np.uint64))
    return sides[0], sides[1]


def post_round(source: Endpoint, peer: str, request: StagedRequest, round_: StagedRound,
               remote_addresses: Addresses, *, timeout_s: float = 60.0) -> int:
    """Write a round's slabs into the destination's staging region (`peer`: the name
    add_remote_agent gave the destination at handshake) and wait for NIXL's done; returns
    the descriptors posted (one per run where a slab is its whole block)."""
    local, remote = run_entries(request.staged, round_, source.addresses, remote_addresses)
    local[:, 2] = source.device
    handle = source.agent.initialize_xfer(
        "WRITE", source.agent.get_xfer_descs(local, source.mem_type),
        source.agent.get_xfer_descs(remote, source.mem_type), peer, b"staged")
    run_to_done(source, handle, timeout_s=timeout_s)
    return len(local)
