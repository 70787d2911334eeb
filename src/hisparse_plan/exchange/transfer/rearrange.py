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
from hisparse_plan.exchange.transfer.program import STAGING_REGION
from hisparse_plan.exchange.transfer.reference import Buffers
from hisparse_plan.exchange.transfer.staged_request import StagedRequest, StagedRound


def _view(buffer: NDArray[np.uint8], offset: int, shape: tuple[int, ...],
          strides: tuple[int, ...]) -> NDArray[np.uint8]:
    """A writable strided view, refused when any of its bytes would leave the buffer."""
    end = offset + sum((n - 1) * s for n, s in zip(shape, strides, strict=True)) + 1
    if offset < 0 or end > buffer.size or min(shape) < 1:
        raise TransferCheckError(f"a copy's bytes {offset}..{end} leave a buffer of "
                                 f"{buffer.size} bytes")
    return as_strided(buffer[offset:], shape=shape, strides=strides, writeable=True)


def stage(round_: StagedRound, request: StagedRequest, source: Buffers, staging: Buffers
          ) -> int:
    """Phase 1 of a round; returns the copies made."""
    phase = round_.phase1
    starts, sizes = phase.runs()
    for slab_index, block, slot, size in zip(
            phase.slab[starts].tolist(), phase.src_ids[starts].tolist(),
            phase.slot[starts].tolist(), sizes.tolist(), strict=True):
        slab = request.staged.slabs[slab_index]
        read = _view(source[(slab.src_rank, slab.src_region)],
                     slab.offset + block * slab.block_stride, (size, slab.length),
                     (slab.block_stride, 1))
        write = _view(staging[(slab.dst_rank, STAGING_REGION)],
                      slab.staging_offset + slot * slab.length, (size, slab.length),
                      (slab.length, 1))
        np.copyto(write, read)
    return int(starts.size)


def rearrange(round_: StagedRound, request: StagedRequest, staging: Buffers,
              destination: Buffers) -> int:
    """Phase 2 of a round; returns the moves made (one strided copy each)."""
    rows, moves = request.staged.pattern.rows, round_.moves
    for index, first, dst_first, size, step, dst_step in zip(
            moves.rows.tolist(), moves.staging.tolist(), moves.dst_id.tolist(),
            moves.size.tolist(), moves.staging_step.tolist(), moves.dst_step.tolist(),
            strict=True):
        row = rows[index]
        read = _view(staging[(row.dst_rank, STAGING_REGION)], first,
                     (size, row.count, row.length),
                     (step, row.src_stride if row.count > 1 else row.length, 1))
        write = _view(destination[(row.dst_rank, row.dst_region)],
                      row.dst_offset + dst_first * row.dst_block_stride,
                      (size, row.count, row.length),
                      (dst_step * row.dst_block_stride,
                       row.dst_stride if row.count > 1 else row.length, 1))
        np.copyto(write, read)
    return int(moves.rows.size)


def execute_staged(request: StagedRequest, source: Buffers, staging: Buffers,
                   destination: Buffers) -> None:
    """Both phases of every round, in order."""
    for round_ in request.rounds:
        stage(round_, request, source, staging)
        rearrange(round_, request, staging, destination)
