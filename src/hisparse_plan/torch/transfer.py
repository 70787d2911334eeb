"""A transfer posted between torch tensors in one process (see docs/transfer.md): a program's
rows copied with `Tensor.copy_` between uint8 views of each side's regions (`execute`), an
instantiated pattern's rows batched by pattern row, one gather and one scatter over the
request's block ids each (`execute_request`), or a staged request's rounds: its slabs copied
per run of blocks into the staging region (`stage_round`), then rearranged with one gather
and one scatter per pattern row (`rearrange_round`); one executor serves CPU, pinned host
and CUDA memory alike. `transfer_regions` (torch/engines.py) finds each region of a rank in
the pools `allocate` returned for its plan."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from hisparse_plan.exchange.transfer import RankRegions, TransferCheckError, TransferProgram
from hisparse_plan.exchange.transfer.pattern.instance import Instantiated
from hisparse_plan.exchange.transfer.pattern.staged_request import StagedRequest, StagedRound
from hisparse_plan.exchange.transfer.program.transfer_program import STAGING_REGION

Regions = Mapping[tuple[int, str], torch.Tensor]
"""(rank, region) -> the tensor holding the region's bytes (any dtype, contiguous)."""


def _flat(regions: Regions, ranks: Sequence[RankRegions], side: str) -> dict[tuple[int, str],
                                                                        torch.Tensor]:
    """Each region of `ranks` as flat uint8, refused when missing, strided or too small."""
    found: dict[tuple[int, str], torch.Tensor] = {}
    for rank in ranks:
        for region in rank.regions:
            key = (rank.rank, region.name)
            tensor = regions.get(key)
            if tensor is None:
                raise TransferCheckError(f"{side} rank {rank.rank}, region {region.name}: "
                                         "no tensor given for it")
            if not tensor.is_contiguous():
                raise TransferCheckError(f"{side} rank {rank.rank}, region {region.name}: "
                                         f"expected a contiguous tensor, got strides "
                                         f"{list(tensor.stride())}")
            flat = tensor.reshape(-1).view(torch.uint8)
            if flat.numel() < region.size:
                raise TransferCheckError(f"{side} rank {rank.rank}, region {region.name}: "
                                         f"expected {region.size} bytes, got {flat.numel()}")
            found[key] = flat[:region.size]
    return found


def _chunks(flat: torch.Tensor, offset: int, length: int, count: int, stride: int
            ) -> torch.Tensor:
    end = offset + (count - 1) * stride + length
    if end > flat.numel():
        raise TransferCheckError(f"a row's bytes {offset}..{end} leave a region of "
                                 f"{flat.numel()} bytes")
    return flat.as_strided((count, length), (stride, 1), flat.storage_offset() + offset)


def execute(program: TransferProgram, source: Regions, destination: Regions) -> int:
    """Copy every row's chunks from `source`'s tensors to `destination`'s; returns the bytes
    moved, every copy finished (CUDA ones waited for)."""
    reads = _flat(source, program.source, "source")
    writes = _flat(destination, program.destination, "destination")
    for row in program.rows:
        read = _chunks(reads[(row.src_rank, row.src_region)], row.src_offset, row.length,
                       row.count, row.src_stride if row.count > 1 else row.length)
        write = _chunks(writes[(row.dst_rank, row.dst_region)], row.dst_offset, row.length,
                        row.count, row.dst_stride if row.count > 1 else row.length)
        # Blocking: a strided copy out of CUDA stages through pageable memory.
        write.copy_(read)
    for device in {t.device for t in (*reads.values(), *writes.values())}:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    return program.bytes


def _by_block(flat: torch.Tensor, offset: int, block_stride: int, blocks: int, count: int,
              length: int, stride: int) -> torch.Tensor:
    """One pattern row at every block id below `blocks`: (block, chunk, byte)."""
    end = offset + (blocks - 1) * block_stride + (count - 1) * stride + length
    if end > flat.numel():
        raise TransferCheckError(f"a row's bytes at block {blocks - 1} end at {end}, past a "
                                 f"region of {flat.numel()} bytes")
    return flat.as_strided((blocks, count, length), (block_stride, stride, 1),
                           flat.storage_offset() + offset)


def execute_request(request: Instantiated, source: Regions, destination: Regions) -> int:
    """Copy an instantiated request: per pattern row, its blocks gathered from the source
    and scattered into the destination (never a Python loop per block); returns the bytes
    moved, every copy finished (CUDA ones waited for)."""
    pattern = request.pattern
    reads = _flat(source, pattern.source, "source")
    writes = _flat(destination, pattern.destination, "destination")
    order = np.argsort(request.rows, kind="stable")
    rows = request.rows[order]
    starts = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]]) if rows.size else rows
    for lo, hi in zip(starts.tolist(), [*starts[1:].tolist(), int(rows.size)], strict=True):
        row = pattern.rows[int(rows[lo])]
        src_ids, dst_ids = request.src_ids[order[lo:hi]], request.dst_ids[order[lo:hi]]
        read, write = reads[(row.src_rank, row.src_region)], writes[(row.dst_rank,
                                                                     row.dst_region)]
        ours = _by_block(read, row.src_offset, row.src_block_stride, int(src_ids.max()) + 1,
                         row.count, row.length, row.src_stride if row.count > 1 else row.length)
        theirs = _by_block(write, row.dst_offset, row.dst_block_stride,
                           int(dst_ids.max()) + 1, row.count, row.length,
                           row.dst_stride if row.count > 1 else row.length)
        gathered = ours[torch.from_numpy(src_ids).to(read.device)]
        theirs[torch.from_numpy(dst_ids).to(write.device)] = gathered.to(write.device)
    for device in {t.device for t in (*reads.values(), *writes.values())}:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    return request.bytes


def _synchronize(*groups: dict[tuple[int, str], torch.Tensor]) -> None:
    for device in {t.device for group in groups for t in group.values()}:
        if device.type == "cuda":
            torch.cuda.synchronize(device)


def stage_round(request: StagedRequest, round_: StagedRound, source: Regions,
                staging: Regions) -> int:
    """Phase 1 of a round in one process: each run of consecutive blocks of a slab copied
    into its slots (one copy per run); returns the copies, every one finished."""
    reads = _flat(source, request.staged.pattern.source, "source")
    writes = _flat(staging, request.staging_regions(), "staging")
    runs = round_.phase1.run_list()
    for slab_index, block, slot, size in runs:
        slab = request.staged.slabs[slab_index]
        read = _by_block(reads[(slab.src_rank, slab.src_region)],
                         slab.offset + block * slab.block_stride, slab.block_stride, size, 1,
                         slab.length, slab.length)
        write = _by_block(writes[(slab.dst_rank, STAGING_REGION)],
                          slab.staging_offset + slot * slab.length, slab.length, size, 1,
                          slab.length, slab.length)
        write.copy_(read)
    _synchronize(reads, writes)
    return len(runs)


def rearrange_round(request: StagedRequest, round_: StagedRound, staging: Regions,
                    destination: Regions) -> int:
    """Phase 2 of a round: per pattern row, its entries gathered from their slots and
    scattered into their blocks (never a Python loop per block); returns the bytes written,
    every copy finished."""
    staged = request.staged
    reads = _flat(staging, request.staging_regions(), "staging")
    writes = _flat(destination, staged.pattern.destination, "destination")
    written = 0
    for index, part in round_.moves.by_row():
        row = staged.pattern.rows[index]
        slab = staged.slabs[staged.row_slab[index]].length
        first, slots, dst_ids = request.gather(round_, index, part)
        read = _by_block(reads[(row.dst_rank, STAGING_REGION)], first, slab,
                         int(slots.max()) + 1, row.count, row.length,
                         row.src_stride if row.count > 1 else row.length)
        write = writes[(row.dst_rank, row.dst_region)]
        theirs = _by_block(write, row.dst_offset, row.dst_block_stride,
                           int(dst_ids.max()) + 1, row.count, row.length,
                           row.dst_stride if row.count > 1 else row.length)
        gathered = read[torch.from_numpy(slots).to(read.device)]
        theirs[torch.from_numpy(dst_ids).to(write.device)] = gathered.to(write.device)
        written += int(slots.size) * row.count * row.length
    _synchronize(reads, writes)
    return written
