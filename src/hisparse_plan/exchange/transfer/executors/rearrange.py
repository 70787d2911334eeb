"""Executing a staged request's two phases over numpy buffers in one process (see
docs/transfer.md#staged-transfers): `stage` copies a round's slabs into the staging region
(one copy per run of consecutive blocks), `rearrange` runs its moves (one strided copy each).
The reference executor runs the same rounds row by row (`phase1_program`, `phase2_program`);
a property test holds the two equal. numpy is imported with this module, never by the
package."""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided
from numpy.typing import NDArray

from hisparse_plan.exchange.transfer.errors import TransferCheckError
from hisparse_plan.exchange.transfer.executors.reference import Buffers
from hisparse_plan.exchange.transfer.pattern.staged_request import StagedRequest, StagedRound
from hisparse_plan.exchange.transfer.program.transfer_program import STAGING_REGION

LARGE_CHUNKS = 1 << 18
"""A row whose entry moves this many bytes or more is copied move by move."""
GATHER_BYTES = 1 << 20
"""Entries of a row of smaller entries gathered at once (about a core's L2 cache)."""


def _view(buffer: NDArray[np.uint8], offset: int, shape: tuple[int, ...],
          strides: tuple[int, ...]) -> NDArray[np.uint8]:
    """A writable strided view, refused when any of its bytes would leave the buffer."""
    end = offset + sum((n - 1) * s for n, s in zip(shape, strides, strict=True)) + 1
    if offset < 0 or end > buffer.size or min(shape) < 1:
        raise TransferCheckError(f"a copy's bytes {offset}..{end} leave a buffer of "
                                 f"{buffer.size} bytes")
    return as_strided(buffer[offset:], shape=shape, strides=strides, writeable=True)


def _buffer(found: Buffers, rank: int, region: str) -> NDArray[np.uint8]:
    buffer = found.get((rank, region))
    if buffer is None:
        raise TransferCheckError(f"rank {rank} has no buffer for region {region!r}")
    return buffer


def stage(round_: StagedRound, request: StagedRequest, source: Buffers, staging: Buffers
          ) -> int:
    """Phase 1 of a round; returns the copies made."""
    runs = round_.phase1.run_list()
    for slab_index, block, slot, size in runs:
        slab = request.staged.slabs[slab_index]
        read = _view(_buffer(source, slab.src_rank, slab.src_region),
                     slab.offset + block * slab.block_stride, (size, slab.length),
                     (slab.block_stride, 1))
        write = _view(_buffer(staging, slab.dst_rank, STAGING_REGION),
                      slab.staging_offset + slot * slab.length, (size, slab.length),
                      (slab.length, 1))
        np.copyto(write, read)
    return len(runs)


def rearrange(round_: StagedRound, request: StagedRequest, staging: Buffers,
              destination: Buffers) -> int:
    """Phase 2 of a round, row by row of the pattern: a row whose chunks are large copies
    each move (a run of entries) as one strided copy; a row of small chunks gathers its
    entries from staging and scatters them into the pools in batches of GATHER_BYTES, so
    the gathered bytes stay in cache and the Python work is per row, not per block.
    Returns the copies made."""
    pattern, moves = request.staged.pattern, round_.moves
    made = 0
    for index, part in moves.by_row():
        row = pattern.rows[index]
        into = _buffer(destination, row.dst_rank, row.dst_region)
        read_from = _buffer(staging, row.dst_rank, STAGING_REGION)
        src_stride = row.src_stride if row.count > 1 else row.length
        dst_stride = row.dst_stride if row.count > 1 else row.length
        if row.count * row.length >= LARGE_CHUNKS:
            for move in part.tolist():
                size = int(moves.size[move])
                read = _view(read_from, int(moves.staging[move]),
                             (size, row.count, row.length),
                             (int(moves.staging_step[move]), src_stride, 1))
                write = _view(into, row.dst_offset + int(moves.dst_id[move])
                              * row.dst_block_stride, (size, row.count, row.length),
                              (int(moves.dst_step[move]) * row.dst_block_stride, dst_stride, 1))
                np.copyto(write, read)
                made += 1
            continue
        base, slots, ids = request.gather(round_, index, part)
        read = _view(read_from, base, (int(slots.max()) + 1, row.count, row.length),
                     (request.staged.slabs[request.staged.row_slab[index]].length,
                      src_stride, 1))
        write = _view(into, row.dst_offset, (int(ids.max()) + 1, row.count, row.length),
                      (row.dst_block_stride, dst_stride, 1))
        batch = max(1, GATHER_BYTES // (row.count * row.length))
        for first in range(0, slots.size, batch):
            write[ids[first:first + batch]] = read[slots[first:first + batch]]
            made += 1
    return made


def execute_staged(request: StagedRequest, source: Buffers, staging: Buffers,
                   destination: Buffers) -> None:
    """Both phases of every round, in order."""
    for round_ in request.rounds:
        stage(round_, request, source, staging)
        rearrange(round_, request, staging, destination)
