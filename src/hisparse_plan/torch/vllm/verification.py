"""`verify` for a vLLM plan: prove on real buffers that every layer view addresses the bytes the
plan names.

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
or more, and different at every position. The raw arithmetic never uses a bound view's
geometry: it reads and writes the pool at addresses computed from the plan's integers, through a
strided view of the raw pool for consecutive blocks, else as gathered and scattered rows of
`unit` bytes. Everything runs as batched tensor ops over chunks of blocks; nothing loops over
blocks in Python.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import NoReturn

import torch

from hisparse_plan.models import KVCachePlan
from hisparse_plan.torch.errors import BackendError, VerifyError
from hisparse_plan.torch.hostmem.tasks import LOG, Progress
from hisparse_plan.torch.verify_layers import (
    Layer,
    Mismatch,
    Scratch,
    block_pattern,
    forward_pattern,
    pattern,
    prepare_layer,
    read_raw,
    read_view,
    reverse_pattern,
    select_blocks,
    write_raw,
    write_view,
)
from hisparse_plan.torch.verifying import VerifyReport, meta_pools_refused
from hisparse_plan.torch.vllm.binding import bind_views, check_bound, describe, pool_name
from hisparse_plan.torch.vllm.pools import Pools
from hisparse_plan.torch.vllm.stages import resolve_stage, stage_views
from hisparse_plan.views import LayerView

LOG_EVERY_S = 5.0
"""A verify running this long logs a line (INFO, "hisparse_plan.torch") at most this often, as
its pool passes and groups finish: progress that needs no terminal."""


class _Steps:
    """Reports each finished unit (a pool's block-id pass, a group) to `progress`, and to the
    log every LOG_EVERY_S seconds."""

    def __init__(self, progress: Progress | None, total: int, started: float) -> None:
        self._progress = progress
        self._total = total
        self._started = self._logged = started
        self.done = 0
        if progress is not None:
            progress("verify", 0, total)

    def finished(self, what: str) -> None:
        self.done += 1
        if self._progress is not None:
            self._progress("verify", self.done, self._total)
        now = time.perf_counter()
        if now - self._logged >= LOG_EVERY_S:
            self._logged = now
            LOG.info("verify: %d of %d passes done (%s), %.1f s", self.done, self._total, what,
                     now - self._started)


def verify_vllm(
    plan: KVCachePlan, pools: Pools, *, blocks: int | None, progress: Progress | None,
    chunk_bytes: int | None,
) -> VerifyReport:
    """`verify` for a vLLM plan (see `hisparse_plan.torch.verify`): every page of the layers
    of the pools' pipeline stage, by the three passes of the module doc."""
    if pools.device.device.type == "meta":
        raise meta_pools_refused()
    started = time.perf_counter()
    device_pool, host_pool = pools.device, pools.host
    # The pools of one pipeline stage hold only that stage's layers: those are the ones checked.
    stage = resolve_stage(plan, pools.stage)
    bound = bind_views(plan, host_pool, device_pool, stage)
    # A sharing layer's view is its target's: its target's passes prove its bytes, and
    # `_check_shared` that it is bound to exactly them.
    views = {name: view for name, view in stage_views(plan, stage).items()
             if name not in plan.kv_sharing}
    _check_shared(plan, bound, views, host_pool, device_pool)
    layers: list[Layer] = []
    selections: dict[tuple[bool, int], tuple[torch.Tensor, bool]] = {}
    scratches: dict[torch.device, Scratch] = {}
    for key, (name, view) in enumerate(views.items()):
        _refuse_shared_axes(view)
        pool = host_pool if view.host_resident and host_pool is not None else device_pool
        where = (view.host_resident, view.num_blocks)
        if where not in selections:
            selections[where] = select_blocks(view.num_blocks, blocks, pool.device)
        scratch = scratches.setdefault(pool.device, Scratch(pool.device))
        layers.append(
            prepare_layer(view, key, bound[name], pool, selections[where], chunk_bytes, scratch)
        )
    pools_used = sorted({layer.view.host_resident for layer in layers}, reverse=True)
    groups = sorted({layer.view.group for layer in layers})
    steps = _Steps(progress, len(groups) + len(pools_used), started)
    for host_resident in pools_used:
        _check_block_ids([layer for layer in layers if layer.view.host_resident == host_resident])
        steps.finished(f"block ids of the {'host' if host_resident else 'device'} pool")
    for index in groups:
        members = [layer for layer in layers if layer.view.group == index]
        _check_group(members)
        steps.finished(f"group {index}, {len(members)} layer(s)")
    if device_pool.device.type == "cuda":
        torch.cuda.synchronize(device_pool.device)
    pages = sum(layer.blocks.numel() for layer in layers)
    return VerifyReport(
        groups=len(groups),
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
    pattern: Callable[[Layer, torch.Tensor], torch.Tensor]
    """The expected pages of a batch of block ids: [blocks, page] bytes."""
    wrote: str
    cause: str


def _check_group(members: list[Layer]) -> None:
    for layer in members:
        for start, ids in layer.batches():
            write_view(layer, ids, start, pattern(layer, ids, forward=True))
    for layer in members:
        _compare_all(layer, _VIEW_TO_POOL)
    for layer in members:
        for _, ids in layer.batches():
            write_raw(layer, ids, pattern(layer, ids, forward=False))
    for layer in members:
        _compare_all(layer, _POOL_TO_VIEW)


def _check_block_ids(members: list[Layer]) -> None:
    for layer in members:
        for start, ids in layer.batches():
            write_view(layer, ids, start, block_pattern(layer, ids))
    for layer in members:
        _compare_all(layer, _BLOCK_IDS)


def _compare_all(layer: Layer, check: _Pass) -> None:
    differs = Mismatch(layer.pool.device)
    for start, ids in layer.batches():
        got = read_raw(layer, ids) if check.raw_read else read_view(layer, ids, start)
        differs.add(got, check.pattern(layer, ids), layer.page)
    # Only a failing layer is scanned again, for its first bad byte.
    if differs:
        _locate(layer, check)


def _locate(layer: Layer, check: _Pass) -> NoReturn:
    for start, ids in layer.batches():
        got = read_raw(layer, ids) if check.raw_read else read_view(layer, ids, start)
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
    layer: Layer, check: _Pass, block: int, byte: int, got: int, expected: int
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


def _check_shared(
    plan: KVCachePlan, bound: dict[str, torch.Tensor], views: dict[str, LayerView],
    host_pool: torch.Tensor | None, device_pool: torch.Tensor,
) -> None:
    """Each sharing layer of the stage is bound to its target's pages, shape, dtype and
    strides, and to nothing else."""
    for name, target in plan.kv_sharing.items():
        if name not in bound:
            continue  # another stage's layer
        view = views[target]
        pool = host_pool if view.host_resident and host_pool is not None else device_pool
        check_bound(replace(view, name=name), bound[name], pool)


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


_VIEW_TO_POOL = _Pass(
    "view -> pool", True, forward_pattern, "written through the layer view",
    "another page of this group (another layer, or another block of this layer) shares that "
    "byte, or the view addresses other bytes than the plan says",
)
_POOL_TO_VIEW = _Pass(
    "pool -> view", False, reverse_pattern, "written by the plan's arithmetic",
    "another page of this group shares that byte, or the view reads other bytes than the plan "
    "says",
)
_BLOCK_IDS = _Pass(
    "block ids", True, block_pattern,
    "written through the layer views with a pattern of each page's block id",
    "a page of another block id (of this group or another) shares that byte; groups may "
    "overlay each other only at the same block id",
)
