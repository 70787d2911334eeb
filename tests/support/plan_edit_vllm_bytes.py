"""The vLLM plan-edit oracle's page geometry and byte section: each layer's page as the engine
views it (its spec, the pool's layout, the tensor's strides), every page enumerated per pool
(plan_edit_bytes), as plan_edit_oracle_vllm's docstring defines sound."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np

from hisparse_plan.models import KVCachePlan
from hisparse_plan.models.group_specs import HisparseHotSpec, HisparseResidentSpec
from hisparse_plan.models.layer_specs import KVLayerSpec, LatentLayerSpec, MambaSpec
from hisparse_plan.models.plan import KVCacheTensor
from hisparse_plan.models.pools import BUFFER_DTYPE_SIZE, Pool
from support.plan_edit_bytes import Ints, TooLarge, first_overlap, row_runs, union
from support.plan_edit_faults import Faults, round_up

Spec = object
"""A layer's own spec (a member of a uniform_type group, else the group's)."""


def stage_names(plan: KVCachePlan) -> list[str]:
    count = len(plan.device_pools)
    return ["device"] if count == 1 else [f"device.{k}" for k in range(count)]


# --- page geometry --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Page:
    """A layer's page: attention [H, N, C bytes] in `itemsize` elements, else a byte buffer of
    `content` bytes; `footprint` bytes with padding."""

    heads: int
    tokens: int
    content: int
    footprint: int
    itemsize: int
    attention: bool
    state_offsets: tuple[tuple[int, int], ...] = ()
    """Mamba: (byte offset in the page, dtype size) of each state."""


def page_of(spec: Spec) -> Page:
    if isinstance(spec, LatentLayerSpec):
        size = BUFFER_DTYPE_SIZE[spec.dtype]
        content = spec.state_content_bytes or spec.head_size * size
        tokens = spec.block_size // spec.compress_ratio
        natural = spec.num_kv_heads * tokens * content
        footprint = natural
        if spec.page_size_padded is not None:
            footprint = spec.page_size_padded
        elif spec.alignment is not None:
            footprint = round_up(natural, spec.alignment)
        return Page(spec.num_kv_heads, tokens, content, footprint, size, True)
    if isinstance(spec, KVLayerSpec):
        size = BUFFER_DTYPE_SIZE[spec.dtype]
        v = spec.head_size if spec.head_size_v is None else spec.head_size_v
        content = (spec.head_size + v) * size
        natural = spec.num_kv_heads * spec.block_size * content
        footprint = natural if spec.page_size_padded is None else spec.page_size_padded
        return Page(spec.num_kv_heads, spec.block_size, content, footprint, size, True)
    if isinstance(spec, MambaSpec):
        offsets = []
        used = 0
        for shape, dtype in zip(spec.state_shapes, spec.state_dtypes, strict=True):
            offsets.append((used, BUFFER_DTYPE_SIZE[dtype]))
            used += round_up(math.prod(shape) * BUFFER_DTYPE_SIZE[dtype], spec.state_alignment)
        footprint = used if spec.page_size_padded is None else spec.page_size_padded
        return Page(1, 1, used, footprint, 1, False, tuple(offsets))
    if isinstance(spec, HisparseResidentSpec | HisparseHotSpec):
        return Page(1, 1, spec.page_size_bytes, spec.page_size_bytes, 1, False)
    raise TypeError(f"no page for {type(spec).__name__}")


def layout_strides(axes: str, extents: dict[str, int], pinned: dict[str, int],
                   padded: int | None) -> dict[str, int]:
    """Byte strides of axes L, B, H, N, C laid out in `axes` order (outermost first)."""
    strides: dict[str, int] = {}
    running = 1
    inner = max(axes.index("L"), axes.index("B"))
    for position in range(len(axes) - 1, -1, -1):
        axis = axes[position]
        if position == inner and padded is not None:
            running = max(running, padded)
        strides[axis] = pinned.get(axis, running)
        running = strides[axis] * extents[axis]
    return strides


# --- bytes ----------------------------------------------------------------------------------


@dataclass(slots=True)
class Runs:
    starts: Ints
    ends: Ints
    block: Ints
    group: Ints


def _layer_runs(plan: KVCachePlan, tensor: KVCacheTensor, position: int, spec: Spec,
                pool: Pool, layout: str, where: str, faults: Faults) -> tuple[Ints, int] | None:
    """Starts of the page runs of one layer, shape (blocks, runs a page), and the run bytes;
    None after reporting a bound or alignment fault."""
    page = page_of(spec)
    nb = pool.num_blocks
    base = tensor.offset + position * tensor.layer_stride
    if page.attention:
        extents = {"L": len(tensor.layers), "B": nb, "H": page.heads, "N": page.tokens,
                   "C": page.content}
        padded = page.footprint if page.footprint != page.heads * page.tokens * page.content \
            else None
        strides = layout_strides(layout, extents,
                                 {"L": tensor.layer_stride, "B": tensor.block_stride}, padded)
        shape = [nb, page.heads, page.tokens, page.content]
        steps = [tensor.block_stride, strides["H"], strides["N"], 1]
        values = {"offset": base, "block stride": tensor.block_stride,
                  "head stride": strides["H"], "token stride": strides["N"]}
        for what, value in values.items():
            if value % page.itemsize:
                faults.add("alignment", f"{where}: {what} {value} is not whole "
                           f"{page.itemsize}-byte elements")
                return None
    else:
        shape, steps = [nb, page.content], [tensor.block_stride, 1]
        for offset, size in page.state_offsets:
            if (base + offset) % size or tensor.block_stride % size:
                faults.add("alignment", f"{where}: a {size}-byte state at byte "
                           f"{base + offset} (block stride {tensor.block_stride})")
                return None
    last = base + (nb - 1) * tensor.block_stride
    end = max(last + page.footprint,
              last + sum((n - 1) * s for n, s in zip(shape[1:], steps[1:], strict=True)) + 1)
    if end > pool.size:
        faults.add("page out of bounds", f"{where}: block {nb - 1} reaches byte {end}, the pool "
                   f"has {pool.size}")
        return None
    starts, run = row_runs(shape, steps, base, 1, 1)
    return starts, run


def vllm_byte_faults(plan: KVCachePlan, specs: dict[str, tuple[int, Spec]], faults: Faults
                     ) -> None:
    """Every page of every pool, enumerated: in bounds, aligned, overlapping only as vLLM's
    block ids allow."""
    layouts = dict(zip(stage_names(plan), (d.layout.value for d in plan.device_pools),
                       strict=True))
    layouts["host"] = "LBNHC" if plan.host_pool is None else plan.host_pool.layout.value
    for pool in plan.pools:
        collected: list[Runs] = []
        for index, tensor in enumerate(plan.tensors):
            if tensor.pool != pool.name:
                continue
            for position, layer in enumerate(tensor.layers):
                group, spec = specs[layer]
                where = f"tensors[{index}] {layer!r}"
                found = _layer_runs(plan, tensor, position, spec, pool, layouts[pool.name],
                                    where, faults)
                if found is None:
                    return
                starts, run = found
                blocks = np.repeat(np.arange(pool.num_blocks, dtype=np.int64), starts.shape[1])
                flat = starts.ravel()
                collected.append(Runs(flat, flat + run, blocks,
                                      np.full(flat.size, group, dtype=np.int64)))
        if collected and not _disjoint(pool.name, collected, faults):
            return


def _disjoint(pool: str, collected: Sequence[Runs], faults: Faults) -> bool:
    """Pages of one group never share a byte; pages of different block ids never do."""
    starts = np.concatenate([r.starts for r in collected])
    ends = np.concatenate([r.ends for r in collected])
    blocks = np.concatenate([r.block for r in collected])
    groups = np.concatenate([r.group for r in collected])
    if starts.size > 4 * 10**7:
        raise TooLarge(f"{starts.size} page runs")
    for group in np.unique(groups):
        mine = groups == group
        clash = first_overlap(starts[mine], ends[mine])
        if clash is not None:
            a, b = (int(blocks[mine][i]) for i in clash)
            faults.add("page overlap", f"pool {pool!r}: two pages of group {int(group)} (blocks "
                       f"{a} and {b}) share a byte")
            return False
    merged_s: list[Ints] = []
    merged_e: list[Ints] = []
    merged_b: list[Ints] = []
    order = np.argsort(blocks, kind="stable")
    bounds = np.r_[0, np.nonzero(np.diff(blocks[order]))[0] + 1, order.size]
    for a, b in pairwise(bounds):
        s, e = union(starts[order[a:b]], ends[order[a:b]])
        merged_s.append(s)
        merged_e.append(e)
        merged_b.append(np.full(s.size, blocks[order[a]], dtype=np.int64))
    all_s, all_e = np.concatenate(merged_s), np.concatenate(merged_e)
    clash = first_overlap(all_s, all_e)
    if clash is not None:
        owners = np.concatenate(merged_b)
        a, b = (int(owners[i]) for i in clash)
        faults.add("page overlap", f"pool {pool!r}: pages of blocks {a} and {b} share a byte")
        return False
    return True
