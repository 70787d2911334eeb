"""Where the host pool may be cut into CUDA registration chunks: pure arithmetic, no CUDA.

One cudaHostRegister call of 512 GiB or more fails, so a big pool is registered in pieces. A
piece must not end inside a page: a copy whose source straddles two registrations is split or
refused by batched copy paths. And registrations are tracked per OS page, so every edge must
also be an OS-page boundary, or one OS page would belong to two chunks. An edge is therefore a
multiple of the OS page size that no page of any host layer crosses: a block boundary that
happens to be page-aligned, or a page-aligned byte in a gap between pages.

The search works on trains (a run of bytes repeated once per block), so its cost grows with the
number of layers, never with the number of blocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from hisparse_plan.torch.errors import BackendError
from hisparse_plan.torch.hostmem.ram import gib

CHUNK_BYTES = 64 * 2**30
"""Default largest registration: well under the 512 GiB a single call can take."""

MAX_REGISTRATION_BYTES = 512 * 2**30
"""cudaHostRegister fails at this size and above."""

_MAX_STEPS = 100_000
"""Bound on the edge search; only a pathological page size gets near it."""


class Train(Protocol):
    """`count` runs of `run` bytes, `period` bytes apart, the first at byte `start` of the pool:
    one range of a layer's pages, once per block (a plan's views give them, as
    `hisparse_plan.views.Train`). `tensor` and `layer` name it in an error."""

    @property
    def start(self) -> int: ...

    @property
    def run(self) -> int: ...

    @property
    def period(self) -> int: ...

    @property
    def count(self) -> int: ...

    @property
    def tensor(self) -> int: ...

    @property
    def layer(self) -> str: ...


def lowest_crossing(train: Train, edge: int) -> int | None:
    """The start of the train's lowest run with start < edge < start + run, or None."""
    if train.run <= 1:
        return None
    if train.period == 0 or train.count == 1:
        return train.start if train.start < edge < train.start + train.run else None
    # Runs crossing `edge` start in (edge - run, edge): blocks first..last.
    first = max(0, _ceil_div(edge - train.run + 1 - train.start, train.period))
    last = min(train.count - 1, (edge - 1 - train.start) // train.period)
    return train.start + first * train.period if first <= last else None


@dataclass(frozen=True, slots=True)
class Chunk:
    """Bytes [start, end) of the host pool, registered by one call."""

    index: int
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


def validate_chunk_bytes(chunk_bytes: int, os_page: int) -> None:
    if not os_page >= 1:
        raise BackendError(f"the OS page size must be at least 1 byte; got {os_page}")
    if chunk_bytes < os_page or chunk_bytes >= MAX_REGISTRATION_BYTES:
        raise BackendError(
            f"register_chunk_bytes is {chunk_bytes}; expected at least one OS page ({os_page} "
            f"bytes) and under {gib(MAX_REGISTRATION_BYTES)}, which one cudaHostRegister "
            "call cannot take"
        )


def plan_chunks(
    size: int, trains: Sequence[Train], *, chunk_bytes: int, os_page: int
) -> list[Chunk]:
    """Cut [0, size) into chunks of at most `chunk_bytes`, each edge OS-page aligned and
    crossed by no run. Greedy from the front: each chunk is as long as the rules allow."""
    validate_chunk_bytes(chunk_bytes, os_page)
    chunks: list[Chunk] = []
    start = 0
    while start < size:
        end = _next_edge(start, size, trains, chunk_bytes, os_page)
        chunks.append(Chunk(len(chunks), start, end))
        start = end
    return chunks


def _next_edge(
    start: int, size: int, trains: Sequence[Train], chunk_bytes: int, os_page: int
) -> int:
    if size - start <= chunk_bytes:
        return size
    edge = (start + chunk_bytes) // os_page * os_page
    blocker: Train | None = None
    for _ in range(_MAX_STEPS):
        if edge <= start:
            break
        lowest: tuple[int, Train] | None = None
        for train in trains:
            low = lowest_crossing(train, edge)
            if low is not None and (lowest is None or low < lowest[0]):
                lowest = (low, train)
        if lowest is None:
            return edge
        # Every edge above the lowest crossing run's start is inside that run: step below it.
        edge = lowest[0] // os_page * os_page
        blocker = lowest[1]
    else:
        raise BackendError(
            f"no registration chunk edge found after byte {start} of the host pool within "
            f"{_MAX_STEPS} steps; raise register_chunk_bytes above {chunk_bytes}"
        )
    named = "" if blocker is None else (
        f" (pages of tensors[{blocker.tensor}] layer {blocker.layer!r} are {blocker.run} bytes "
        f"every {blocker.period})"
    )
    raise BackendError(
        f"the host pool has no OS-page boundary ({os_page} bytes) that no page crosses between "
        f"byte {start} and byte {start + chunk_bytes}{named}; expected one within each "
        f"registration chunk, so raise register_chunk_bytes above {chunk_bytes}"
    )


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)
