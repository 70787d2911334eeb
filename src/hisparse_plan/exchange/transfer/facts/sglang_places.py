"""check_transfer's reading of an SGLang plan's places: each buffer view's pattern from its element
strides and storage offset; the lowering reads SGLang's page ranges instead, so a slip in either
shows as a refused program."""

from __future__ import annotations

from math import prod

from hisparse_plan.errors import PlanError
from hisparse_plan.exchange.transfer.facts.byte_layout import (
    Axis,
    ByteLayout,
    Origin,
    StatePieces,
    addressing,
)
from hisparse_plan.exchange.transfer.facts.sglang_facts import HOST_POOL, region_name, table_of
from hisparse_plan.models.pools import BUFFER_DTYPE_SIZE, BufferView
from hisparse_plan.models.sglang_plan import SGLangPlan


def sglang_regions(plan: SGLangPlan) -> list[tuple[str, int, str]]:
    """(name, bytes, location) of every allocation: a pool's one buffer, or each layer's buffer
    of a per-layer pool."""
    return [(region_name(pool, layer), pool.size, pool.location)
            for pool in plan.pools for layer in plan.allocation_layers(pool)]


def _part_order(view: str) -> int:
    """Where a buffer's field sits in the logical row: K before V; conv states (in order)
    before the temporal state."""
    if view == "v_buffer":
        return 1
    if view.startswith("conv["):
        return int(view[5:].rstrip("]"))
    return 1000 if view == "temporal" else 0


def sglang_patterns(plan: SGLangPlan, wanted: set[str], origin: Origin, pieces: StatePieces
                    ) -> list[ByteLayout]:
    pools = {pool.name: pool for pool in plan.pools}
    hosted = {name for tensor in plan.tensors if tensor.pool == HOST_POOL
              for name in tensor.layers}
    drafts: list[tuple[int, ByteLayout]] = []
    parts: dict[str, dict[int, int]] = {}
    shapes: dict[str, dict[int, tuple[int, ...]]] = {}
    for tensor in plan.tensors:
        pool = pools[tensor.pool]
        table = table_of(pool.name)
        if table is None or not wanted.intersection(tensor.layers):
            continue
        if plan.hisparse is not None and pool.name in ("kv", "kv_v") \
                and set(tensor.layers) <= hosted:
            continue
        whole = pool.allocation == "whole"
        page = pool.block_tokens or 1
        for view in tensor.views:
            size = BUFFER_DTYPE_SIZE[view.dtype]
            order = _part_order(view.name)
            nbytes, units, axes = _rowaddressing(view, 1 if whole else 0, page, size,
                                            table == "mamba")
            base = view.storage_offset * size
            if whole:
                layers = tuple(tensor.layers)
                axes.append(Axis("layer", view.strides[0] * size, view.shape[0]))
                groups = [(pool.name, layers)]
            else:
                groups = [(region_name(pool, name), (name,)) for name in tensor.layers]
            for region, layers in groups:
                for name in layers:
                    parts.setdefault(name, {})[order] = nbytes
                    shapes.setdefault(name, {})[order] = tuple(view.shape[2 if whole else 1:])
                drafts.append((order, ByteLayout(region, base, nbytes, 0, layers,
                                              origin(layers[0]), units, table, addressing(*axes),
                                              state=table == "mamba")))
    found: list[ByteLayout] = []
    for order, pattern in drafts:
        layer = pattern.layers[0]
        if not pattern.state:
            found.append(_at(pattern, sum(size for key, size in parts[layer].items()
                                          if key < order)))
            continue
        # A state's pieces of the full state (one piece, rank to rank); each state starts
        # where the full states before it end.
        lo = 0
        for index, key in enumerate(sorted(parts[layer])):
            cut, full = pieces(layer, index, shapes[layer][key], parts[layer][key])
            if key == order:
                found.extend(ByteLayout(pattern.region, pattern.base + mine, length,
                                        lo + theirs, pattern.layers, pattern.head_origin,
                                        pattern.units, pattern.table, pattern.axes, True)
                             for mine, theirs, length in cut)
                break
            lo += full
    return found


def _at(pattern: ByteLayout, lo: int) -> ByteLayout:
    return ByteLayout(pattern.region, pattern.base, pattern.size, lo, pattern.layers,
                   pattern.head_origin, pattern.units, pattern.table, pattern.axes,
                   pattern.state)


def _rowaddressing(view: BufferView, lead: int, page: int, size: int, state: bool
              ) -> tuple[int, int, list[Axis]]:
    """(bytes of the field, units per block, its axes) of a buffer laid out [(layers,)
    token rows, heads, elements], [(layers,) pages, bytes] or [layers, slots, state...]."""
    shape, strides = list(view.shape[lead:]), list(view.strides[lead:])
    if state or view.name == "index_k":
        expected = 1
        for extent, stride in zip(reversed(shape[1:]), reversed(strides[1:]), strict=True):
            if extent > 1 and stride != expected:
                raise PlanError(f"buffer {view.name!r}: expected a contiguous row, got strides "
                                f"{view.strides}", field=f"views[{view.name!r}]")
            expected *= extent
        return prod(shape[1:]) * size, 1, [Axis("block", strides[0] * size, shape[0])]
    if len(shape) != 3 or strides[-1] != 1:
        raise PlanError(f"buffer {view.name!r}: expected [rows, heads, elements] with "
                        f"contiguous rows, got shape {view.shape} strides {view.strides}",
                        field=f"views[{view.name!r}]")
    rows, heads, elements = shape
    row_stride = strides[0] * size
    return elements * size, page, [
        Axis("block", page * row_stride, rows // page),
        Axis("unit", row_stride, page),
        Axis("head", strides[1] * size, heads),
    ]
