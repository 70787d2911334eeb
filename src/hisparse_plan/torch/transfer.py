"""A transfer program posted between torch tensors in one process (see docs/transfer.md): the
rows copied with `Tensor.copy_` between uint8 views of each side's regions, so one executor
serves CPU, pinned host and CUDA memory alike. `transfer_regions` (torch/engines.py) finds
each region of a rank in the pools `allocate` returned for its plan."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from hisparse_plan.exchange.transfer import RankRegions, TransferCheckError, TransferProgram

Regions = Mapping[tuple[int, str], torch.Tensor]
"""(rank, region) -> the tensor holding the region's bytes (any dtype, contiguous)."""


def _flat(regions: Regions, ranks: list[RankRegions], side: str) -> dict[tuple[int, str],
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
