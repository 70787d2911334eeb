"""The SGLang plan-edit oracle's byte section: every page range and every view element of each
allocation enumerated (plan_edit_bytes), as plan_edit_oracle_sglang's docstring defines sound."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import prod

import numpy as np

from hisparse_plan.models.pools import BUFFER_DTYPE_SIZE, BufferView, Pool
from hisparse_plan.models.sglang_plan import SGLangPlan
from support.plan_edit_bytes import (
    Ints,
    end_byte,
    first_overlap,
    inside,
    merge_touching,
    row_runs,
    self_aliasing_axis,
    union,
)
from support.plan_edit_faults import Faults


@dataclass(frozen=True, slots=True)
class Entry:
    """One layer of one tensor in an allocation."""

    tensor: int
    position: int


def sglang_byte_faults(plan: SGLangPlan, faults: Faults) -> None:
    """Pages and views of every allocation, enumerated."""
    for pool in plan.pools:
        members = [i for i, t in enumerate(plan.tensors) if t.pool == pool.name]
        if pool.allocation == "whole":
            entries = [Entry(i, pos) for i in members for pos in range(len(plan.tensors[i].layers))]
            _allocation(plan, pool, entries, True, f"pool {pool.name!r}", faults)
        else:
            done: set[tuple[tuple[int, int], ...]] = set()
            for layer in plan.allocation_layers(pool):
                entries = [Entry(i, pos) for i in members
                           for pos, name in enumerate(plan.tensors[i].layers) if name == layer]
                # Allocations of the same tensors at the same byte offsets are alike.
                key = tuple((e.tensor, e.position * plan.tensors[e.tensor].layer_stride)
                            for e in entries)
                if key in done:
                    continue
                done.add(key)
                _allocation(plan, pool, entries, False, f"pool {pool.name!r} layer {layer!r}",
                            faults)
                if faults:
                    return
        if faults:
            return


@dataclass(slots=True)
class Pages:
    starts: Ints
    ends: Ints
    owner: Ints
    """entry index * num_blocks + block."""


def _pages(plan: SGLangPlan, pool: Pool, entries: Sequence[Entry], where: str,
           faults: Faults) -> Pages | None:
    nb = pool.num_blocks
    total = 0
    for e in entries:
        tensor = plan.tensors[e.tensor]
        base = tensor.offset + e.position * tensor.layer_stride
        for part in tensor.ranges or []:
            end = base + (nb - 1) * tensor.block_stride + part.offset + part.size
            if end > pool.size:
                faults.add("page out of bounds", f"{where}: {tensor.layers[e.position]!r} "
                           f"block {nb - 1} ends at byte {end}, the allocation has {pool.size}")
                return None
            total += nb * part.size
    if total > pool.size:
        faults.add("page overlap", f"{where}: pages of {total} bytes in {pool.size}")
        return None
    blocks = np.arange(nb, dtype=np.int64)
    starts, ends, owner = [], [], []
    for index, e in enumerate(entries):
        tensor = plan.tensors[e.tensor]
        base = tensor.offset + e.position * tensor.layer_stride
        for part in tensor.ranges or []:
            s = base + part.offset + blocks * tensor.block_stride
            starts.append(s)
            ends.append(s + part.size)
            owner.append(index * nb + blocks)
    if not starts:
        empty = np.zeros(0, dtype=np.int64)
        return Pages(empty, empty, empty)
    return Pages(np.concatenate(starts), np.concatenate(ends), np.concatenate(owner))


@dataclass(slots=True)
class ViewRuns:
    view: BufferView
    tensor: int
    starts: Ints
    """Byte starts, one row of runs per (layer, row) of the view, C order."""
    run: int
    layers: int
    """Extent of the layer axis (1 for a per-layer pool's view)."""
    rows: int
    layered: bool


def _view_runs(
    view: BufferView, tensor: int, layered: bool, size: int, where: str, faults: Faults
) -> ViewRuns | None:
    itemsize = BUFFER_DTYPE_SIZE[view.dtype]
    shape, strides = list(view.shape), list(view.strides)
    lead = 2 if layered else 1
    name = f"{where} view {view.name!r}"
    if len(shape) < lead:
        faults.add("view axes", f"{name} has {len(shape)} axes, expected a "
                   f"{'layer and a ' if layered else ''}row axis")
        return None
    axis = self_aliasing_axis(shape, strides)
    if axis is not None:
        faults.add("view aliasing", f"{name}: axis {axis} of {shape[axis]} elements has stride 0")
        return None
    end = end_byte(shape, strides, view.storage_offset, itemsize)
    if end > size:
        faults.add("view out of bounds", f"{name} reaches byte {end}, the allocation has {size}")
        return None
    if prod(shape) * itemsize > size:
        faults.add("view aliasing", f"{name}: {prod(shape)} elements of {itemsize} bytes in "
                   f"{size}")
        return None
    starts, run = row_runs(shape, strides, view.storage_offset, itemsize, lead)
    layers = shape[0] if layered else 1
    return ViewRuns(view, tensor, starts, run, layers, shape[lead - 1], layered)


def _allocation(
    plan: SGLangPlan, pool: Pool, entries: Sequence[Entry], layered: bool, where: str,
    faults: Faults,
) -> None:
    pages = _pages(plan, pool, entries, where, faults)
    if pages is None:
        return
    clash = first_overlap(pages.starts, pages.ends)
    if clash is not None:
        a, b = (_page_name(plan, entries, pool.num_blocks, int(pages.owner[i])) for i in clash)
        faults.add("page overlap", f"{where}: {a} and {b} share a byte")
        return
    tail = int(pages.ends.max()) if pages.ends.size else 0
    views: list[ViewRuns] = []
    for tensor in dict.fromkeys(e.tensor for e in entries):
        for view in plan.tensors[tensor].views:
            found = _view_runs(view, tensor, layered, pool.size, where, faults)
            if found is None:
                return
            views.append(found)
    if views:
        starts = np.concatenate([v.starts.ravel() for v in views])
        ends = np.concatenate([v.starts.ravel() + v.run for v in views])
        clash = first_overlap(starts, ends)
        if clash is not None:
            faults.add("view aliasing", f"{where}: two view elements share byte "
                       f"{int(starts[clash[1]])}")
            return
    merged = merge_touching(pages.starts, pages.ends, pages.owner)
    for runs in views:
        if not _walks_its_pages(runs, pool, entries, merged, tail):
            faults.add("view misplaced", f"{where} view {runs.view.name!r}: a row lies outside "
                       "the page of its block (and a spare row meets a page)")
            return
    for tensor in dict.fromkeys(e.tensor for e in entries):
        _covered(tensor, pool, entries, pages, views, where, faults)
        if faults:
            return


def _walks_its_pages(
    runs: ViewRuns, pool: Pool, entries: Sequence[Entry], merged: tuple[Ints, Ints, Ints],
    tail: int,
) -> bool:
    """Row i of layer l in the page of block i // r of layer l of its tensor (or, past the
    blocks or the layers, on no page), for r one of the pool's block_tokens and 1."""
    nb = pool.num_blocks
    per_row = runs.starts.shape[1]
    if per_row == 0:
        return True
    index = np.arange(runs.starts.shape[0], dtype=np.int64)
    layer, row = index // runs.rows, index % runs.rows
    if runs.layered:
        lookup = {e.position: i for i, e in enumerate(entries) if e.tensor == runs.tensor}
        positions = np.array([lookup.get(n, -1) for n in range(runs.layers)], dtype=np.int64)
    else:
        first = next(i for i, e in enumerate(entries) if e.tensor == runs.tensor)
        positions = np.array([first], dtype=np.int64)
    entry = positions[layer]
    starts = runs.starts.ravel()
    ends = starts + runs.run
    found = inside(starts, ends, merged[0], merged[1])
    owner = np.where(found >= 0, merged[2][np.maximum(found, 0)], -1)
    # A spare element meets no page: the last page run starting before its end ends by its
    # start (the runs are sorted and apart).
    before = np.searchsorted(merged[0], ends, side="left") - 1
    free = (starts >= tail) | (before < 0) | (merged[1][np.maximum(before, 0)] <= starts)
    for rows_a_block in dict.fromkeys((pool.block_tokens or 1, 1)):
        block = row // rows_a_block
        regular = (entry >= 0) & (block < nb)
        want = np.repeat(np.where(regular, entry * nb + block, -2), per_row)
        ok = np.where(np.repeat(regular, per_row), owner == want, free)
        if bool(ok.all()):
            return True
    return False


def _covered(
    tensor: int, pool: Pool, entries: Sequence[Entry], pages: Pages,
    views: Sequence[ViewRuns], where: str, faults: Faults,
) -> None:
    """Every page byte of the tensor is an element of one of its views."""
    mine = [v for v in views if v.tensor == tensor]
    is_mine = np.array([e.tensor == tensor for e in entries], dtype=bool)
    own = is_mine[pages.owner // pool.num_blocks]
    if not own.any():
        return
    if not mine:
        faults.add("page not viewed", f"{where}: tensors[{tensor}] has pages but no view")
        return
    starts = np.concatenate([v.starts.ravel() for v in mine])
    ends = starts + np.concatenate([np.full(v.starts.size, v.run, dtype=np.int64) for v in mine])
    covered_s, covered_e = union(starts, ends)
    held = inside(pages.starts[own], pages.ends[own], covered_s, covered_e)
    if bool((held < 0).any()):
        first = int(pages.starts[own][np.nonzero(held < 0)[0][0]])
        faults.add("page not viewed", f"{where}: tensors[{tensor}]'s page byte {first} is in "
                   "no view of it")


def _page_name(plan: SGLangPlan, entries: Sequence[Entry], nb: int, owner: int) -> str:
    entry = entries[owner // nb]
    layer = plan.tensors[entry.tensor].layers[entry.position]
    return f"tensors[{entry.tensor}] {layer!r} block {owner % nb}"
