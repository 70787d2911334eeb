"""A layer prepared for `verify`: its pages as rows of pool units, its patterns, and batched
reads and writes through the layer view and through the plan's raw arithmetic.

The raw side never uses the bound view's geometry: `raw_region` lays a strided view over the raw
pool, and `unit_index` computes every unit's pool index, both from the plan's integers (offset +
block * block_stride + row start), so a bound view that addresses other bytes than the plan says
is caught by comparing the two sides.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from hisparse_plan.views import LayerView

CPU_CHUNK_BYTES = 32 * 2**20
"""Page bytes per batch on the CPU: large enough that each tensor op streams for milliseconds
(every op is a fork and join of torch's threads, which on a busy machine can wait a scheduler
slice), small enough that a batch's few scratch buffers stay a small fraction of the pools."""
CUDA_CHUNK_BYTES = 256 * 2**20
"""Page bytes per batch on a GPU: enough work to hide kernel launches and the per-layer sync."""

_WIDEST = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
"""The integer type of each element width the raw gathers and scatters use."""

_KEY_SHIFT = 40
"""Block ids take the low 40 bits of a page key; the layer's position the bits above."""
_LOW_62 = 2**62 - 1
_LOW_32 = 2**32 - 1
_LOW_31 = 2**31 - 1
_BLOCK_MIX = (0x5BD1E9, 0x27D4EB)
"""Odd multipliers below 2**23: block id times either stays below 2**63 for ids below 2**40,
and each half of a block's word is a bijection of the id modulo 2**32 (2**31 for the high)."""


class Scratch:
    """Reused batch buffers, one set per device. Fresh multi-MiB temporaries every batch would
    fault their pages in again each time, which costs more than the verification itself."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._buffers: dict[str, torch.Tensor] = {}

    def take(self, name: str, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
        nbytes = math.prod(shape) * dtype.itemsize
        buffer = self._buffers.get(name)
        if buffer is None or buffer.numel() < nbytes:
            # Rounded up to whole 8-byte words so that any dtype view of the buffer is legal.
            buffer = torch.empty(-(-nbytes // 8) * 8, dtype=torch.uint8, device=self.device)
            self._buffers[name] = buffer
        return buffer[:nbytes].view(dtype).view(shape)


@dataclass(frozen=True, slots=True)
class Layer:
    view: LayerView
    key: int
    data: torch.Tensor
    """The bound layer view, reinterpreted as bytes: [num_blocks, *page dims]."""
    pool: torch.Tensor
    page: int
    row: int
    """Bytes per contiguous row of the page, in the page's logical order."""
    grid: torch.Tensor
    """Row starts within a page, relative to the page's first byte, in logical order."""
    dims: tuple[tuple[int, int], ...]
    """The page axes that repeat the row, as (extent, byte stride): what `grid` enumerates."""
    unit: int
    """Rows and their addresses are whole units: the raw pool is gathered unit by unit."""
    element: torch.dtype
    """The widest integer type dividing a unit: gathers move elements, and wider is faster."""
    blocks: torch.Tensor
    everything: bool
    chunk: int
    """Blocks per batch."""
    seeds: tuple[torch.Tensor, torch.Tensor]
    """The layer's random page words for pool -> view and for view -> pool."""
    scratch: Scratch

    def batches(self) -> Iterator[tuple[int, torch.Tensor]]:
        """(position in the selection, block ids) of each batch."""
        for start in range(0, self.blocks.numel(), self.chunk):
            yield start, self.blocks[start:start + self.chunk]


class Mismatch:
    """Whether any batch of one layer and direction differed. On a GPU the answer stays on the
    device until asked, so batches run without a host sync each."""

    def __init__(self, device: torch.device) -> None:
        lazy = device.type == "cuda"
        self._flag = torch.zeros((), dtype=torch.bool, device=device) if lazy else None
        self._seen = False

    def add(self, got: torch.Tensor, expected: torch.Tensor, page: int) -> None:
        if page % 8 == 0:
            # Compare words, not bytes, where both sides allow it (a batch buffer starts on an
            # 8-byte boundary; a view of the pool may not).
            with contextlib.suppress(RuntimeError):
                got, expected = got.view(torch.int64), expected.view(torch.int64)
        if self._flag is not None:
            self._flag |= torch.ne(got, expected).any()
        elif not self._seen:
            self._seen = not torch.equal(got, expected)

    def __bool__(self) -> bool:
        return bool(self._flag) if self._flag is not None else self._seen


def select_blocks(
    num_blocks: int, blocks: int | None, device: torch.device
) -> tuple[torch.Tensor, bool]:
    if blocks is None or blocks >= num_blocks:
        return torch.arange(num_blocks, device=device), True
    spread = torch.linspace(0, num_blocks - 1, steps=max(blocks, 2), dtype=torch.float64)
    ends = torch.tensor([0, 1, num_blocks - 2, num_blocks - 1], dtype=torch.int64)
    chosen = torch.cat([spread.round().to(torch.int64), ends.clamp(0, num_blocks - 1)])
    return torch.unique(chosen).to(device), False


def prepare_layer(
    view: LayerView,
    key: int,
    tensor: torch.Tensor,
    pool: torch.Tensor,
    selection: tuple[torch.Tensor, bool],
    chunk_bytes: int | None,
    scratch: Scratch,
) -> Layer:
    data = tensor if tensor.dtype == torch.uint8 else tensor.view(torch.uint8)
    dims = [*zip(view.shape[1:-1], view.strides[1:-1], strict=True)]
    row = view.shape[-1] * view.itemsize
    # Inner axes that continue the row contiguously join it; the rest repeat it.
    while dims and (dims[-1][0] == 1 or dims[-1][1] == row):
        extent, _ = dims.pop()
        row *= extent
    grid = torch.zeros(1, dtype=torch.int64)
    for extent, stride in dims:
        grid = (grid[:, None] + torch.arange(extent, dtype=torch.int64) * stride).reshape(-1)
    unit = math.gcd(row, view.offset, view.block_stride if view.num_blocks > 1 else 0,
                    *(stride for extent, stride in dims if extent > 1))
    element = _WIDEST[math.gcd(unit, 8)]
    page = math.prod(data.shape[1:])
    words = -(-page // 8)
    if chunk_bytes is None:
        chunk_bytes = _default_chunk_bytes(pool.device)
    blocks, everything = selection
    return Layer(
        view=view, key=key, data=data, pool=pool, page=page, row=row,
        grid=grid.to(pool.device), dims=tuple(dims), unit=unit, element=element, blocks=blocks,
        everything=everything,
        chunk=max(1, chunk_bytes // page),
        seeds=(_seed_words(key, words, pool.device, forward=False),
               _seed_words(key, words, pool.device, forward=True)),
        scratch=scratch,
    )


def _default_chunk_bytes(device: torch.device) -> int:
    if device.type != "cuda":
        return CPU_CHUNK_BYTES
    # The pools may have taken most of the GPU: a batch needs about four times its page bytes
    # of scratch (pattern, read-back, indices, comparison), so stay well inside what is free.
    free, _ = torch.cuda.mem_get_info(device)
    return max(2**20, min(CUDA_CHUNK_BYTES, free // 8))


def pool_units(layer: Layer) -> torch.Tensor:
    usable = layer.pool.numel() // layer.unit * layer.unit
    return layer.pool[:usable].view(layer.element).view(usable // layer.unit, -1)


def unit_index(layer: Layer, ids: torch.Tensor) -> torch.Tensor:
    """The unit index of every unit of the pages of blocks `ids`, in page logical order: the
    plan's arithmetic, offset + block * block_stride + row start, in units."""
    view, unit = layer.view, layer.unit
    starts = (view.offset + ids * view.block_stride)[:, None] + layer.grid[None, :]
    first = (starts // unit).reshape(-1)
    per_row = layer.row // unit
    if per_row == 1:
        return first
    steps = torch.arange(per_row, dtype=torch.int64, device=ids.device)
    out = layer.scratch.take("index", torch.int64, (first.numel(), per_row))
    return torch.add(first[:, None], steps[None, :], out=out).view(-1)


def _seed_words(key: int, words: int, device: torch.device, *, forward: bool) -> torch.Tensor:
    generator = torch.Generator().manual_seed(2 * key + int(forward))
    raw = torch.randint(0, 256, (words * 8,), dtype=torch.uint8, generator=generator)
    # Below 2**62, so adding a key (below 2**62 too) never overflows int64.
    return (raw.view(torch.int64) & _LOW_62).to(device)


def _words(layer: Layer, ids: torch.Tensor, *, forward: bool) -> torch.Tensor:
    """The expected pages of blocks `ids` as 8-byte words: [len(ids), words]."""
    seeds = layer.seeds[int(forward)]
    keys = ids + (layer.key << _KEY_SHIFT)
    out = layer.scratch.take("words", torch.int64, (ids.numel(), seeds.numel()))
    return torch.add(seeds[None, :], keys[:, None], out=out)


def forward_pattern(layer: Layer, ids: torch.Tensor) -> torch.Tensor:
    return pattern(layer, ids, forward=True)


def reverse_pattern(layer: Layer, ids: torch.Tensor) -> torch.Tensor:
    return pattern(layer, ids, forward=False)


def pattern(layer: Layer, ids: torch.Tensor, *, forward: bool) -> torch.Tensor:
    """The expected pages of blocks `ids` as bytes: [len(ids), page]."""
    pages = _words(layer, ids, forward=forward).view(torch.uint8)
    return pages if pages.shape[1] == layer.page else pages[:, : layer.page]


def _block_words(ids: torch.Tensor) -> torch.Tensor:
    """One 8-byte word per block id, different for every id below 2**32, with every byte
    changing between neighbours. Built from 32-bit halves so nothing overflows int64."""
    low = (ids * _BLOCK_MIX[0] + 1) & _LOW_32
    high = (ids * _BLOCK_MIX[1] + 7) & _LOW_31
    return low | (high << 32)


def block_pattern(layer: Layer, ids: torch.Tensor) -> torch.Tensor:
    """Pages whose byte at pool address a is byte (a mod 8) of the block's word: the same
    for every page of one block id, whatever its group, so legal overlays agree."""
    words = _block_words(ids)
    if layer.unit % 8 == 0:
        # Every row starts on an 8-byte boundary: the page is the word, repeated.
        out = layer.scratch.take("words", torch.int64, (ids.numel(), layer.page // 8))
        out.copy_(words[:, None].expand(out.shape))
        return out.view(torch.uint8)
    # Otherwise each row starts at its own phase within the word: cut each row out of a tape
    # of repeated words at that phase.
    rows = layer.grid.numel()
    tape_words = -(-layer.row // 8) + 1
    tape = words[:, None].expand(ids.numel(), tape_words).contiguous().view(torch.uint8)
    phase = ((layer.view.offset + ids * layer.view.block_stride)[:, None]
             + layer.grid[None, :]) % 8
    windows = tape.unfold(1, layer.row, 1)
    picked = windows[torch.arange(ids.numel(), device=ids.device)[:, None], phase]
    return picked.reshape(ids.numel(), rows * layer.row)


def as_units(layer: Layer, pages: torch.Tensor) -> torch.Tensor:
    return pages.contiguous().view(layer.element).view(-1, pool_units(layer).shape[1])


def write_view(layer: Layer, ids: torch.Tensor, start: int, pages: torch.Tensor) -> None:
    shaped = pages.view(pages.shape[0], *layer.data.shape[1:])
    if layer.everything:
        layer.data[start:start + ids.numel()].copy_(shaped)
    else:
        layer.data.index_copy_(0, ids, shaped)


def read_view(layer: Layer, ids: torch.Tensor, start: int) -> torch.Tensor:
    if layer.everything:
        chunk = layer.data[start:start + ids.numel()]
    else:
        chunk = layer.data.index_select(0, ids)
    if layer.everything and chunk.is_contiguous():
        return chunk.view(ids.numel(), layer.page)  # compared where it lies: no copy
    got = layer.scratch.take("got", torch.uint8, (ids.numel(), layer.page))
    got.view(chunk.shape).copy_(chunk)
    return got


def raw_region(layer: Layer, start: int, count: int, *, writable: bool) -> torch.Tensor | None:
    """The pages of blocks `start .. start + count - 1` straight from the raw pool, by the plan's
    arithmetic (offset + block * block_stride + row start): [count, page] bytes in page logical
    order, a strided view where the pages allow one, else None (use the index gather). With
    `writable`, None also when two of those bytes are one pool byte, which a strided write
    cannot express."""
    view, element = layer.view, layer.element
    size = element.itemsize
    dims = [(extent, stride) for extent, stride in layer.dims if extent > 1]
    shape = [count, *(extent for extent, _ in dims), layer.row // size]
    strides = [view.block_stride // size, *(stride // size for _, stride in dims), 1]
    first = view.offset + start * view.block_stride
    if writable and not _disjoint(layer.row, [(count, view.block_stride), *dims]):
        return None
    flat = layer.pool[: layer.pool.numel() // size * size].view(element)
    last = first // size + sum((n - 1) * st for n, st in zip(shape, strides, strict=True))
    if first < 0 or last >= flat.numel():
        return None
    region = flat.as_strided(shape, strides, flat.storage_offset() + first // size)
    bytes_view = region.view(torch.uint8) if size > 1 else region
    if writable:
        return bytes_view
    try:
        return bytes_view.view(count, layer.page)
    except RuntimeError:  # rows apart: a reshape would copy into fresh memory every batch
        return None


def _consecutive_start(layer: Layer, ids: torch.Tensor) -> int | None:
    """The first block of `ids` when they are a slice of a layer that checks every block (its
    selection is 0, 1, 2, ...), read from the slice itself: no device sync."""
    blocks = layer.blocks
    if not layer.everything or ids.dim() != 1 or (ids.numel() > 1 and ids.stride(0) != 1):
        return None
    if ids.untyped_storage().data_ptr() != blocks.untyped_storage().data_ptr():
        return None
    return int(ids.storage_offset()) - int(blocks.storage_offset())


def _disjoint(row: int, dims: list[tuple[int, int]]) -> bool:
    """Whether rows of `row` bytes repeated along `dims` (extent, stride) never share a byte:
    each axis, from the finest stride up, must step past everything inside it."""
    span = row
    for extent, stride in sorted(dims, key=lambda dim: dim[1]):
        if extent <= 1:
            continue
        if stride < span:
            return False
        span = stride * (extent - 1) + span
    return True


def read_raw(layer: Layer, ids: torch.Tensor) -> torch.Tensor:
    """The pages of blocks `ids` as the raw pool holds them: [len(ids), page] bytes; a strided
    view of the pool where the blocks are consecutive and the pages allow it, else gathered."""
    start = _consecutive_start(layer, ids)
    if start is not None:
        region = raw_region(layer, start, ids.numel(), writable=False)
        if region is not None:
            return region
    units = pool_units(layer)
    index = unit_index(layer, ids)
    got = layer.scratch.take("got", layer.element, (index.numel(), units.shape[1]))
    torch.index_select(units, 0, index, out=got)
    return got.view(torch.uint8).view(ids.numel(), layer.page)


def write_raw(layer: Layer, ids: torch.Tensor, pages: torch.Tensor) -> None:
    """Write [len(ids), page] bytes into the raw pool at the pages of blocks `ids`, by the
    plan's arithmetic: through a strided view where it can, else scattered."""
    start = _consecutive_start(layer, ids)
    if start is not None:
        region = raw_region(layer, start, ids.numel(), writable=True)
        if region is not None:
            region.copy_(pages.view(region.shape))
            return
    pool_units(layer).index_copy_(0, unit_index(layer, ids), as_units(layer, pages))
