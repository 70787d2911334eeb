"""`verify` for an SGLang plan: every page range of every layer, and every SGLang buffer, on real
bytes, one allocation at a time.

Pages. Each range of each layer is a train of [num_blocks, range bytes] over its allocation,
handled by the vLLM passes' own batch machinery (`verify_layers`) as a one-range "layer": a
pattern distinct per (layer, block, range) is written through every page view of the
allocation, then read back raw at the plan's addresses (offset + layer * layer_stride +
block * block_stride + range offset); then a second pattern the other way. Nothing in an SGLang
allocation may share a byte (no overlaid groups), so all ranges of an allocation are one group
and any two pages that meet show up as the later write inside the earlier page; vLLM's separate
block-id pass, which exists to let groups overlay at one block id, has nothing to add here.

Buffers. Each of SGLang's own tensors is first checked for its plan dtype, shape, strides and
storage offset on its allocation's storage; then, on a sample of its rows (every row when
`blocks` is None), a pattern of the byte address is written raw and read through the tensor,
and another written through the tensor and read raw, at addresses computed from the plan's
numbers alone. Every row must also lie where check_plan proves it: row t of a layer in that
layer's page t // page_size (SGLang's k_buffer), never padding between pages; a spare row past
the last block (DeepSeek-V4's compressor states, a window pool's K half capped at an unaligned
token count) in bytes no page of its allocation owns.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import NoReturn

import torch

from hisparse_plan.models.pools import BUFFER_DTYPE_SIZE, Pool
from hisparse_plan.models.sglang_plan import SGLangPlan
from hisparse_plan.torch.errors import BackendError, VerifyError
from hisparse_plan.torch.hostmem.tasks import Progress
from hisparse_plan.torch.sglang.binding import (
    PageTrain,
    PlacedView,
    allocations,
    bind_buffer,
    bind_pages,
    check_buffer,
    describe_allocation,
    page_trains,
    placed_views,
)
from hisparse_plan.torch.sglang.pools import SGLangPools
from hisparse_plan.torch.sglang.row_pages import RowPages, check_owned
from hisparse_plan.torch.verify_layers import (
    Layer,
    Mismatch,
    Scratch,
    pattern,
    prepare_layer,
    read_raw,
    read_view,
    select_blocks,
    write_raw,
    write_view,
)
from hisparse_plan.torch.verifying import VerifyReport, meta_pools_refused
from hisparse_plan.views import LayerView

BUFFER_BATCH_BYTES = 4 * 2**20
"""Buffer bytes per batch of the buffer pass: each byte also takes an 8-byte address."""

_LOW_32 = 2**32 - 1
_LOW_31 = 2**31 - 1
_ADDRESS_MIX = (0x5BD1E9, 0x27D4EB, 0x3C6EF3, 0x1B8735)
"""Odd multipliers below 2**23: word indices below 2**40 times any of them stay inside int64."""


def verify_sglang(
    plan: SGLangPlan, pools: SGLangPools, *, blocks: int | None, progress: Progress | None,
    chunk_bytes: int | None,
) -> VerifyReport:
    """`verify` for an SGLang plan (see `hisparse_plan.torch.verify`): every allocation of
    `pools` (module doc), in plan order; `progress("verify", done, total)` counts allocations.
    The report's `groups` counts allocations, and `pages` (layer, block, range) page ranges."""
    # `plan` decides every address, `pools` only lends the buffers: a plan edited after
    # allocation is checked against real bytes, not trusted (as for vLLM plans).
    held = pools.allocations()
    if any(buffer.device.type == "meta" for buffer in held.values()):
        raise meta_pools_refused()
    started = time.perf_counter()
    pool_of = {pool.name: pool for pool in plan.pools}
    # Another stage's device pools are legitimately absent; anything else the plan places
    # must have its buffer here, or its pages would go unchecked.
    ours = [pool for pool in plan.pools if pool.location == "host" or pool.stage == pools.stage]
    missing = [key for key in allocations(plan, ours) if key not in held]
    if missing:
        raise BackendError(
            f"the plan places pages in {describe_allocation(missing[0])}, which these pools do "
            f"not hold; expected the pools that allocate(plan) returned for this plan"
        )
    trains = [train for train in page_trains(plan) if train.allocation in held]
    views = [placed for placed in placed_views(plan) if placed.allocation in held]
    keys = list(held)
    if progress is not None:
        progress("verify", 0, len(keys))
    scratches: dict[torch.device, Scratch] = {}
    pages = page_bytes = 0
    sampled = False
    for done, key in enumerate(keys, start=1):
        allocation = held[key]
        pool = pool_of[key[0]]
        selection = select_blocks(pool.num_blocks, blocks, allocation.device)
        sampled = sampled or not selection[1]
        scratch = scratches.setdefault(allocation.device, Scratch(allocation.device))
        members = [train for train in trains if train.allocation == key]
        layers = [
            _prepare(train, number, allocation, selection, chunk_bytes, scratch)
            for number, train in enumerate(members)
        ]
        _check_pages(layers)
        pages += sum(layer.blocks.numel() for layer, _ in layers)
        page_bytes += sum(layer.blocks.numel() * layer.page for layer, _ in layers)
        end = max((train.start + (train.num_blocks - 1) * train.block_stride + train.size
                   for train in members), default=0)
        numbers: dict[int, int] = {}
        for placed in views:
            if placed.allocation == key:
                # View i of a tensor walks its range i: one train per layer, in layer order.
                number = numbers[placed.tensor] = numbers.get(placed.tensor, -1) + 1
                owners = [train for train in members
                          if (train.tensor, train.range) == (placed.tensor, number)]
                _check_buffer(placed, allocation, (owners, members), blocks, pool, end)
        if progress is not None:
            progress("verify", done, len(keys))
    if any(buffer.device.type == "cuda" for buffer in held.values()):
        torch.cuda.synchronize()
    layer_names = {train.layer for train in trains}
    return VerifyReport(groups=len(keys), layers=len(layer_names), pages=pages, bytes=page_bytes,
                        seconds=time.perf_counter() - started, sampled=sampled)


# --- pages -----------------------------------------------------------------------------------


def _prepare(
    train: PageTrain, key: int, allocation: torch.Tensor,
    selection: tuple[torch.Tensor, bool], chunk_bytes: int | None, scratch: Scratch,
) -> tuple[Layer, PageTrain]:
    if train.num_blocks > 1 and train.block_stride == 0:
        # Torch refuses to write through a view whose rows share bytes: name the clash instead.
        raise VerifyError(
            f"verify failed: {train.where()}: blocks 0 and 1 share every byte (block stride 0), "
            f"starting at byte {train.start}; expected each block's range to have its own bytes",
            tensor=train.tensor, layer=train.layer, block=1, byte_offset=train.start,
        )
    view = LayerView(
        name=train.layer, tensor=train.tensor, group=0, host_resident=train.host_resident,
        stage=train.stage, dtype="uint8", shape=(train.num_blocks, train.size),
        strides=(train.block_stride, 1), offset=train.start, page_size_bytes=train.size,
    )
    bound = bind_pages(train, allocation)
    return prepare_layer(view, key, bound, allocation, selection, chunk_bytes, scratch), train


def _check_pages(members: list[tuple[Layer, PageTrain]]) -> None:
    """Forward pattern through the page views, read raw; reverse pattern raw, read through the
    page views. Every range of the allocation is written before any is read."""
    for layer, _ in members:
        for start, ids in layer.batches():
            write_view(layer, ids, start, pattern(layer, ids, forward=True))
    for layer, train in members:
        _compare(layer, train, raw=True)
    for layer, _ in members:
        for _, ids in layer.batches():
            write_raw(layer, ids, pattern(layer, ids, forward=False))
    for layer, train in members:
        _compare(layer, train, raw=False)


def _compare(layer: Layer, train: PageTrain, *, raw: bool) -> None:
    differs = Mismatch(layer.pool.device)
    for start, ids in layer.batches():
        got = read_raw(layer, ids) if raw else read_view(layer, ids, start)
        differs.add(got, pattern(layer, ids, forward=raw), layer.page)
    if differs:
        _locate(layer, train, raw=raw)


def _locate(layer: Layer, train: PageTrain, *, raw: bool) -> NoReturn:
    view = layer.view
    for start, ids in layer.batches():
        got = read_raw(layer, ids) if raw else read_view(layer, ids, start)
        bad = torch.nonzero(got != pattern(layer, ids, forward=raw))
        if not bad.numel():
            continue
        row, byte = (int(value) for value in bad[0])
        block = int(ids[row])
        address = view.offset + block * view.block_stride + byte
        value, wanted = int(got[row, byte]), int(pattern(layer, ids[row:row + 1],
                                                         forward=raw)[0, byte])
        how = (f"written through the page view, the allocation holds {value:#04x} at byte "
               f"{address}; expected {wanted:#04x}" if raw else
               f"written at byte {address} by the plan's arithmetic, the page view reads "
               f"{value:#04x}; expected {wanted:#04x}")
        raise VerifyError(
            f"verify failed ({'page -> allocation' if raw else 'allocation -> page'}): "
            f"{train.where()}, block {block}, range byte {byte}: {how}. Likely cause: another "
            "page "
            "of this allocation (another layer, block or range) shares that byte, or the page "
            "view addresses other bytes than the plan says",
            tensor=view.tensor, layer=view.name, block=block, byte_offset=address,
        )
    raise BackendError(  # pragma: no cover - only a non-deterministic pool gets here
        f"tensors[{view.tensor}] layer {view.name!r}: a mismatch was seen but not found again"
    )


# --- buffers ---------------------------------------------------------------------------------


def row_pattern(starts: torch.Tensor, run: int, salt: int) -> torch.Tensor:
    """[rows, run] bytes: the pattern of the `run` bytes from each address in `starts`. Byte a
    of an allocation is byte (a mod 8) of a word made from (a // 8, salt), so a byte gets one
    value however it is reached, neighbours differ, and the two salts differ. The words are
    built from 32-bit halves so that nothing overflows int64, one per 8 bytes, then cut at
    each row's phase."""
    first = starts >> 3
    count = -(-run // 8) + 1
    words = first[:, None] + torch.arange(count, dtype=torch.int64, device=starts.device)
    low = (words * _ADDRESS_MIX[0] + salt * _ADDRESS_MIX[2] + 1) & _LOW_32
    high = (words * _ADDRESS_MIX[1] + salt * _ADDRESS_MIX[3] + 7) & _LOW_31
    tape = (low | (high << 32)).view(torch.uint8)
    phase = starts & 7
    if not bool(phase.any()):
        return tape[:, :run]
    columns = phase[:, None] + torch.arange(run, dtype=torch.int64, device=starts.device)
    return torch.gather(tape, 1, columns)


_WIDEST = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _rows(placed: PlacedView, tensor: torch.Tensor) -> tuple[torch.Tensor, list[int], list[int],
                                                             int]:
    """The tensor as bytes [*shape, itemsize], and its rows by the plan's numbers: (bytes, row
    shape, row byte strides, run bytes). A contiguous last axis joins the run; otherwise each
    element is a run. The bytes view takes the bound tensor as it is, whatever its strides, so
    that a tensor bound wrongly is read where it really points."""
    view = placed.view
    size = BUFFER_DTYPE_SIZE[view.dtype]
    data = tensor.unsqueeze(-1)
    data = data if data.dtype == torch.uint8 else data.view(torch.uint8)
    if len(view.shape) >= 2 and view.strides[-1] == 1:
        return (data, list(view.shape[:-1]), [stride * size for stride in view.strides[:-1]],
                view.shape[-1] * size)
    return data, list(view.shape), [stride * size for stride in view.strides], size


def _unravel(ids: torch.Tensor, shape: list[int]) -> list[torch.Tensor]:
    indices = []
    for extent in reversed(shape):
        indices.append(ids % extent)
        ids = ids // extent
    return indices[::-1]


def _check_buffer(
    placed: PlacedView, allocation: torch.Tensor,
    trains: tuple[list[PageTrain], list[PageTrain]], blocks: int | None, pool: Pool,
    page_end: int,
) -> None:
    """SGLang's tensor bound as the plan says; its rows where check_plan proves them, read and
    written both ways. `trains`: the view's own range's trains (one a layer), then every train
    of the allocation (which a spare row may not meet)."""
    owners, members = trains
    view = placed.view
    tensor = bind_buffer(placed, allocation)
    check_buffer(placed, tensor, allocation)
    where = f"view {view.name!r} of tensors[{placed.tensor}] on " + describe_allocation(
        placed.allocation)
    for axis, (extent, stride) in enumerate(zip(view.shape, view.strides, strict=True)):
        if extent > 1 and stride == 0:
            raise VerifyError(
                f"verify failed: {where}: entries 0 and 1 of axis {axis} share every byte "
                "(stride 0); expected each element of SGLang's tensor to have its own bytes",
                tensor=placed.tensor, layer=placed.allocation[1] or "", block=0,
                byte_offset=view.storage_offset * BUFFER_DTYPE_SIZE[view.dtype],
            )
    data, row_shape, row_strides, run = _rows(placed, tensor)
    count = math.prod(row_shape)
    if count == 0 or run == 0:
        return
    # A sample about as dense as the page sample: `blocks` blocks' worth of rows, spread out.
    wanted = None if blocks is None else max(blocks, blocks * -(-count // pool.num_blocks))
    ids, _ = select_blocks(count, wanted, allocation.device)
    base = view.storage_offset * BUFFER_DTYPE_SIZE[view.dtype]
    # The raw side moves whole units: the widest integer every row start and length divides.
    unit = math.gcd(8, run, base, *row_strides)
    element = _WIDEST[unit]
    units = allocation[: allocation.numel() // unit * unit].view(element)
    steps = torch.arange(run // unit, dtype=torch.int64, device=allocation.device)
    per = max(1, BUFFER_BATCH_BYTES // run)
    pages = RowPages.of(placed, owners, pool, (page_end, allocation.numel()), members)
    for batch in _batches(ids, per):
        index = _unravel(batch, row_shape)
        starts = torch.full_like(batch, base)
        for position, step in zip(index, row_strides, strict=True):
            starts += position * step
        check_owned(where, placed, starts, run, pages, index)
        at = (starts // unit)[:, None] + steps[None, :]
        first = row_pattern(starts, run, 1)
        units[at] = first.contiguous().view(element)
        at_rows = tuple(index)
        _compare_rows(where, placed, data[at_rows].reshape(-1, run), first, starts, index,
                      "written at the plan's address, SGLang's tensor reads")
        second = row_pattern(starts, run, 2)
        data[at_rows] = second.reshape(-1, *data.shape[len(at_rows):])
        _compare_rows(where, placed, units[at].view(torch.uint8), second, starts, index,
                      "written through SGLang's tensor, the allocation holds")


def _batches(ids: torch.Tensor, per: int) -> Iterator[torch.Tensor]:
    for start in range(0, ids.numel(), per):
        yield ids[start:start + per]


def _compare_rows(
    where: str, placed: PlacedView, got: torch.Tensor, expected: torch.Tensor,
    starts: torch.Tensor, index: list[torch.Tensor], how: str,
) -> None:
    if torch.equal(got, expected):
        return
    row, byte = (int(value) for value in torch.nonzero(got != expected)[0])
    address = int(starts[row]) + byte
    position = [int(axis[row]) for axis in index]
    raise VerifyError(
        f"verify failed (buffer): {where}: row {position}, row byte {byte} (byte {address} of "
        f"the allocation): {how} {int(got[row, byte]):#04x}; expected "
        f"{int(expected[row, byte]):#04x}. Likely cause: the tensor addresses other bytes "
        "than its dtype, shape, strides and storage offset say",
        tensor=placed.tensor, layer=placed.allocation[1] or "", block=-1, byte_offset=address,
    )

