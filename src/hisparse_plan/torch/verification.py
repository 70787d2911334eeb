"""`verify`: prove on real buffers that every layer view addresses the bytes the plan names.

Three passes, each writing a pattern one way and reading it back the other:

* view -> pool, one group at a time (groups overlay each other by design): write through every
  layer view of the group, then read the raw pool at the addresses the plan's arithmetic gives
  (offset + block * block_stride + ...) and compare every byte. All layers are written before
  any is read, so two pages of one group that share a byte (two layers, or two blocks of one
  layer) show up as the later write inside the earlier page.
* pool -> view, one group at a time: write a second pattern into the raw pool at those
  addresses, then read it back through every layer view.
* block ids, one pool at a time: every page of every group writes a pattern that depends only
  on its block id and the byte's address. Pages of different groups at the same block id may
  share bytes and agree on them; a page that reaches into a page of another block id (a block
  stride too short, an offset shifted into the next block) leaves the wrong block's bytes.

The per-group pattern of a page is one random 8-byte word per position, drawn per layer, plus
the page's key `layer << 40 | block`: unique to (tensor, layer, block) for every page of 8 bytes
or more, and different at every position. The raw arithmetic never uses a view's geometry: it
gathers and scatters the pool as rows of `unit` bytes, at indices computed from the plan's
integers. Everything runs as batched tensor ops over chunks of blocks; nothing loops over blocks
in Python.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import NoReturn

import torch

from hisparse_plan.models import KVCachePlan
from hisparse_plan.torch.binding import bind_views, describe, pool_name
from hisparse_plan.torch.errors import BackendError, VerifyError
from hisparse_plan.torch.pools import Pools
from hisparse_plan.torch.tasks import Progress, as_progress
from hisparse_plan.views import LayerView, plan_views

CPU_CHUNK_BYTES = 4 * 2**20
"""Page bytes per batch on the CPU: the scratch of one batch stays in cache."""
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


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """What `verify` checked: `pages` layer pages of `bytes` bytes in all, each written and read
    back in every pass, in `seconds`."""

    groups: int
    layers: int
    pages: int
    bytes: int
    seconds: float
    sampled: bool
    """False when every block of every layer was checked."""

    @property
    def gb_per_s(self) -> float:
        """Page bytes verified per second, in 10**9 bytes."""
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else math.inf


class _Scratch:
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


class _Mismatch:
    """Whether any batch of one layer and direction differed. On a GPU the answer stays on the
    device until asked, so batches run without a host sync each."""

    def __init__(self, device: torch.device) -> None:
        lazy = device.type == "cuda"
        self._flag = torch.zeros((), dtype=torch.bool, device=device) if lazy else None
        self._seen = False

    def add(self, got: torch.Tensor, expected: torch.Tensor, page: int) -> None:
        if page % 8 == 0 and got.is_contiguous() and expected.is_contiguous():
            # A fresh batch buffer starts on an 8-byte boundary: compare words, not bytes.
            got, expected = got.view(torch.int64), expected.view(torch.int64)
        if self._flag is not None:
            self._flag |= torch.ne(got, expected).any()
        elif not self._seen:
            self._seen = not torch.equal(got, expected)

    def __bool__(self) -> bool:
        return bool(self._flag) if self._flag is not None else self._seen


@dataclass(frozen=True, slots=True)
class _Layer:
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
    scratch: _Scratch

    def batches(self) -> Iterator[tuple[int, torch.Tensor]]:
        """(position in the selection, block ids) of each batch."""
        for start in range(0, self.blocks.numel(), self.chunk):
            yield start, self.blocks[start:start + self.chunk]


def verify(
    plan: KVCachePlan,
    pools: Pools,
    *,
    blocks: int | None = None,
    progress: Progress | Callable[[int, int], None] | None = None,
    chunk_bytes: int | None = None,
) -> VerifyReport:
    """Check every byte of every layer page of `plan` on `pools`, both ways (module doc).

    `blocks` limits each pool to a sample of about that many block ids spread from first to
    last, always including the first two and the last two; None checks every block.
    `progress("verify", done, total)` is called at the start and as each unit finishes: every
    pool's block-id pass, then every group (a two-parameter `progress(done, total)` is still
    accepted). `chunk_bytes` is the page bytes handled per batch (default 4 MiB on the CPU, up
    to 256 MiB on a GPU, bounded by its free memory). Raises `VerifyError`
    at the first byte that disagrees, `BackendError` when a view cannot even be bound (outside
    its pool, misaligned) or the pools were released.
    """
    if blocks is not None and blocks < 1:
        raise BackendError(f"blocks is {blocks}; expected None (every block) or at least 1")
    if chunk_bytes is not None and chunk_bytes < 1:
        raise BackendError(f"chunk_bytes is {chunk_bytes}; expected at least 1")
    device_pool = pools.device
    if device_pool.device.type == "meta":
        raise BackendError(
            "verify needs real buffers, and meta pools hold no bytes; use meta_check(plan) to "
            "check the views of a full-size plan"
        )
    started = time.perf_counter()
    try:
        return _verify(plan, pools, blocks, as_progress(progress), chunk_bytes, started)
    except torch.OutOfMemoryError as error:
        raise BackendError(
            f"verify ran out of device memory for its batch buffers ({error}); pass a smaller "
            "chunk_bytes"
        ) from error


def _verify(
    plan: KVCachePlan,
    pools: Pools,
    blocks: int | None,
    progress: Progress | None,
    chunk_bytes: int | None,
    started: float,
) -> VerifyReport:
    device_pool, host_pool = pools.device, pools.host
    bound = bind_views(plan, host_pool, device_pool)
    views = plan_views(plan)
    layers: list[_Layer] = []
    selections: dict[tuple[bool, int], tuple[torch.Tensor, bool]] = {}
    scratches: dict[torch.device, _Scratch] = {}
    for key, (name, view) in enumerate(views.items()):
        _refuse_shared_axes(view)
        pool = host_pool if view.host_resident and host_pool is not None else device_pool
        where = (view.host_resident, view.num_blocks)
        if where not in selections:
            selections[where] = _select(view.num_blocks, blocks, pool.device)
        scratch = scratches.setdefault(pool.device, _Scratch(pool.device))
        layers.append(
            _layer(view, key, bound[name], pool, selections[where], chunk_bytes, scratch)
        )
    pools_used = sorted({layer.view.host_resident for layer in layers}, reverse=True)
    total = len(plan.groups) + len(pools_used)
    done = 0
    if progress is not None:
        progress("verify", done, total)
    for host_resident in pools_used:
        _check_block_ids([layer for layer in layers if layer.view.host_resident == host_resident])
        done += 1
        if progress is not None:
            progress("verify", done, total)
    for index in range(len(plan.groups)):
        _check_group([layer for layer in layers if layer.view.group == index])
        done += 1
        if progress is not None:
            progress("verify", done, total)
    if device_pool.device.type == "cuda":
        torch.cuda.synchronize(device_pool.device)
    pages = sum(layer.blocks.numel() for layer in layers)
    return VerifyReport(
        groups=len(plan.groups),
        layers=len(layers),
        pages=pages,
        bytes=sum(layer.blocks.numel() * layer.page for layer in layers),
        seconds=time.perf_counter() - started,
        sampled=not all(everything for _, everything in selections.values()),
    )


@dataclass(frozen=True, slots=True)
class _Pass:
    name: str
    raw_read: bool
    """Read back from the raw pool by arithmetic (else through the layer view)."""
    pattern: Callable[[_Layer, torch.Tensor], torch.Tensor]
    """The expected pages of a batch of block ids: [blocks, page] bytes."""
    wrote: str
    cause: str


def _check_group(members: list[_Layer]) -> None:
    for layer in members:
        for start, ids in layer.batches():
            _write_view(layer, ids, start, _pattern(layer, ids, forward=True))
    for layer in members:
        _compare_all(layer, _VIEW_TO_POOL)
    for layer in members:
        for _, ids in layer.batches():
            expected = _pattern(layer, ids, forward=False)
            _units(layer).index_copy_(0, _unit_index(layer, ids), _as_units(layer, expected))
    for layer in members:
        _compare_all(layer, _POOL_TO_VIEW)


def _check_block_ids(members: list[_Layer]) -> None:
    for layer in members:
        for start, ids in layer.batches():
            _write_view(layer, ids, start, _block_pattern(layer, ids))
    for layer in members:
        _compare_all(layer, _BLOCK_IDS)


def _compare_all(layer: _Layer, check: _Pass) -> None:
    differs = _Mismatch(layer.pool.device)
    for start, ids in layer.batches():
        got = _read_raw(layer, ids) if check.raw_read else _read_view(layer, ids, start)
        differs.add(got, check.pattern(layer, ids), layer.page)
    # Only a failing layer is scanned again, for its first bad byte.
    if differs:
        _locate(layer, check)


def _locate(layer: _Layer, check: _Pass) -> NoReturn:
    for start, ids in layer.batches():
        got = _read_raw(layer, ids) if check.raw_read else _read_view(layer, ids, start)
        expected = check.pattern(layer, ids)
        bad = torch.nonzero(got != expected)
        if bad.numel():
            row, byte = (int(value) for value in bad[0])
            _raise(layer, check, int(ids[row]), byte, int(got[row, byte]),
                   int(expected[row, byte]))
    raise BackendError(  # pragma: no cover - only a non-deterministic pool gets here
        f"{describe(layer.view)}: a mismatch was seen but not found again on a second read"
    )


def _raise(
    layer: _Layer, check: _Pass, block: int, byte: int, got: int, expected: int
) -> NoReturn:
    view = layer.view
    position, address = _address(view, block, byte)
    pool = f"{pool_name(view)} pool"
    if check.raw_read:
        how = (f"{check.wrote}, the {pool} holds {got:#04x} at byte {address}; expected "
               f"{expected:#04x}")
    else:
        how = (f"{check.wrote} at byte {address} of the {pool}, the layer view reads {got:#04x}; "
               f"expected {expected:#04x}")
    raise VerifyError(
        f"verify failed ({check.name}): {describe(view)} block {block}, page byte {byte}"
        f"{position}: {how}. Likely cause: {check.cause}",
        tensor=view.tensor, layer=view.name, block=block, byte_offset=address,
    )


def _address(view: LayerView, block: int, byte: int) -> tuple[str, int]:
    """A page byte (logical order) as its position in the page and its pool address."""
    extents = [*view.shape[1:-1], view.shape[-1] * view.itemsize]
    strides = [*view.strides[1:-1], 1]
    indices = []
    rest = byte
    for extent in reversed(extents):
        rest, index = divmod(rest, extent)
        indices.append(index)
    indices.reverse()
    address = view.offset + block * view.block_stride + sum(
        index * stride for index, stride in zip(indices, strides, strict=True)
    )
    if len(indices) == 3:
        head, token, column = indices
        return f" (head {head}, token {token}, byte {column})", address
    return "", address


def _refuse_shared_axes(view: LayerView) -> None:
    # A zero stride on an axis of several entries folds them onto the same bytes; torch refuses
    # to write through such a view, so name the clash instead.
    for axis, (extent, stride) in enumerate(zip(view.shape, view.strides, strict=True)):
        if extent > 1 and stride == 0:
            what = "blocks 0 and 1" if axis == 0 else f"entries 0 and 1 of page axis {axis}"
            raise VerifyError(
                f"verify failed: {describe(view)}: {what} share every byte (stride 0), starting "
                f"at byte {view.offset} of the {pool_name(view)} pool; expected each page and "
                "each element of a page to have its own bytes",
                tensor=view.tensor, layer=view.name, block=1 if axis == 0 else 0,
                byte_offset=view.offset,
            )


def _select(num_blocks: int, blocks: int | None, device: torch.device) -> tuple[torch.Tensor, bool]:
    if blocks is None or blocks >= num_blocks:
        return torch.arange(num_blocks, device=device), True
    spread = torch.linspace(0, num_blocks - 1, steps=max(blocks, 2), dtype=torch.float64)
    ends = torch.tensor([0, 1, num_blocks - 2, num_blocks - 1], dtype=torch.int64)
    chosen = torch.cat([spread.round().to(torch.int64), ends.clamp(0, num_blocks - 1)])
    return torch.unique(chosen).to(device), False


def _layer(
    view: LayerView,
    key: int,
    tensor: torch.Tensor,
    pool: torch.Tensor,
    selection: tuple[torch.Tensor, bool],
    chunk_bytes: int | None,
    scratch: _Scratch,
) -> _Layer:
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
    return _Layer(
        view=view, key=key, data=data, pool=pool, page=page, row=row,
        grid=grid.to(pool.device), unit=unit, element=element, blocks=blocks, everything=everything,
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


def _units(layer: _Layer) -> torch.Tensor:
    usable = layer.pool.numel() // layer.unit * layer.unit
    return layer.pool[:usable].view(layer.element).view(usable // layer.unit, -1)


def _unit_index(layer: _Layer, ids: torch.Tensor) -> torch.Tensor:
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


def _words(layer: _Layer, ids: torch.Tensor, *, forward: bool) -> torch.Tensor:
    """The expected pages of blocks `ids` as 8-byte words: [len(ids), words]."""
    seeds = layer.seeds[int(forward)]
    keys = ids + (layer.key << _KEY_SHIFT)
    out = layer.scratch.take("words", torch.int64, (ids.numel(), seeds.numel()))
    return torch.add(seeds[None, :], keys[:, None], out=out)


def _forward_pattern(layer: _Layer, ids: torch.Tensor) -> torch.Tensor:
    return _pattern(layer, ids, forward=True)


def _reverse_pattern(layer: _Layer, ids: torch.Tensor) -> torch.Tensor:
    return _pattern(layer, ids, forward=False)


def _pattern(layer: _Layer, ids: torch.Tensor, *, forward: bool) -> torch.Tensor:
    """The expected pages of blocks `ids` as bytes: [len(ids), page]."""
    pages = _words(layer, ids, forward=forward).view(torch.uint8)
    return pages if pages.shape[1] == layer.page else pages[:, : layer.page]


def _block_words(ids: torch.Tensor) -> torch.Tensor:
    """One 8-byte word per block id, different for every id below 2**32, with every byte
    changing between neighbours. Built from 32-bit halves so nothing overflows int64."""
    low = (ids * _BLOCK_MIX[0] + 1) & _LOW_32
    high = (ids * _BLOCK_MIX[1] + 7) & _LOW_31
    return low | (high << 32)


def _block_pattern(layer: _Layer, ids: torch.Tensor) -> torch.Tensor:
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


def _as_units(layer: _Layer, pages: torch.Tensor) -> torch.Tensor:
    return pages.contiguous().view(layer.element).view(-1, _units(layer).shape[1])


def _write_view(layer: _Layer, ids: torch.Tensor, start: int, pages: torch.Tensor) -> None:
    shaped = pages.view(pages.shape[0], *layer.data.shape[1:])
    if layer.everything:
        layer.data[start:start + ids.numel()].copy_(shaped)
    else:
        layer.data.index_copy_(0, ids, shaped)


def _read_view(layer: _Layer, ids: torch.Tensor, start: int) -> torch.Tensor:
    if layer.everything:
        chunk = layer.data[start:start + ids.numel()]
    else:
        chunk = layer.data.index_select(0, ids)
    got = layer.scratch.take("got", torch.uint8, (ids.numel(), layer.page))
    got.view(chunk.shape).copy_(chunk)
    return got


def _read_raw(layer: _Layer, ids: torch.Tensor) -> torch.Tensor:
    units = _units(layer)
    index = _unit_index(layer, ids)
    got = layer.scratch.take("got", layer.element, (index.numel(), units.shape[1]))
    torch.index_select(units, 0, index, out=got)
    return got.view(torch.uint8).view(ids.numel(), layer.page)


_VIEW_TO_POOL = _Pass(
    "view -> pool", True, _forward_pattern, "written through the layer view",
    "another page of this group (another layer, or another block of this layer) shares that "
    "byte, or the view addresses other bytes than the plan says",
)
_POOL_TO_VIEW = _Pass(
    "pool -> view", False, _reverse_pattern, "written by the plan's arithmetic",
    "another page of this group shares that byte, or the view reads other bytes than the plan "
    "says",
)
_BLOCK_IDS = _Pass(
    "block ids", True, _block_pattern,
    "written through the layer views with a pattern of each page's block id",
    "a page of another block id (of this group or another) shares that byte; groups may "
    "overlay each other only at the same block id",
)
