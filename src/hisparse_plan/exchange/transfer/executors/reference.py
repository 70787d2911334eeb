"""The reference executor: posts a transfer program over two sets of buffers in one process
(numpy, uint8 per region). It knows rows and regions only. numpy is a dev dependency, so
this module is imported on its own, never by the package."""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided
from numpy.typing import NDArray

from hisparse_plan.exchange.transfer.errors import TransferCheckError
from hisparse_plan.exchange.transfer.program.transfer_program import RankRegions, TransferProgram

Buffers = dict[tuple[int, str], NDArray[np.uint8]]
"""(rank, region) -> the region's bytes."""


RANDOM_PIECE = 1 << 26
"""Random bytes are drawn this many at a time (a multiple of 8, so the bytes are those of one
draw of the whole region), never holding a region's bytes twice."""


def buffers(ranks: list[RankRegions], fill: int | None = 0, seed: int = 0) -> Buffers:
    """One uint8 buffer per region of every rank: `fill` bytes, or random ones (None)."""
    generator = np.random.default_rng(seed)
    found: Buffers = {}
    for rank in ranks:
        for region in rank.regions:
            if fill is None:
                buffer = np.empty(region.size, dtype=np.uint8)
                for at in range(0, region.size, RANDOM_PIECE):
                    size = min(RANDOM_PIECE, region.size - at)
                    buffer[at:at + size] = np.frombuffer(generator.bytes(size), dtype=np.uint8)
                found[(rank.rank, region.name)] = buffer
            else:
                found[(rank.rank, region.name)] = np.full(region.size, fill, dtype=np.uint8)
    return found


def addresses(regions: Buffers) -> dict[tuple[int, str], tuple[int, int]]:
    """Each buffer's (base address, bytes) in this process: what a NIXL endpoint registers."""
    return {key: (int(value.ctypes.data), value.nbytes) for key, value in regions.items()}


def _chunks(buffer: NDArray[np.uint8], offset: int, length: int, count: int, stride: int
            ) -> NDArray[np.uint8]:
    end = offset + (count - 1) * stride + length
    if offset < 0 or end > buffer.size:
        raise TransferCheckError(f"a row's bytes {offset}..{end} leave a buffer of "
                                 f"{buffer.size} bytes")
    return as_strided(buffer[offset:], shape=(count, length), strides=(stride, 1),
                      writeable=True)


def execute(program: TransferProgram, source: Buffers, destination: Buffers) -> None:
    """Copy every row's chunks from `source` to `destination` (TransferCheckError for a row
    whose region has no buffer, or whose bytes leave it)."""
    for index, row in enumerate(program.rows):
        read = _chunks(_buffer(source, row.src_rank, row.src_region, index), row.src_offset,
                       row.length, row.count, row.src_stride if row.count > 1 else row.length)
        write = _chunks(_buffer(destination, row.dst_rank, row.dst_region, index),
                        row.dst_offset, row.length, row.count,
                        row.dst_stride if row.count > 1 else row.length)
        write[...] = read


def _buffer(found: Buffers, rank: int, region: str, index: int) -> NDArray[np.uint8]:
    buffer = found.get((rank, region))
    if buffer is None:
        raise TransferCheckError(f"row {index}: rank {rank} has no buffer for region "
                                 f"{region!r}", row=index)
    return buffer
