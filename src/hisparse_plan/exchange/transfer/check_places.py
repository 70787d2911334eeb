"""check_transfer's own reading of where each logical byte lives: one `Pattern` per tensor
(and field), derived from the plans' public descriptions with arithmetic of its own: a vLLM
plan's transfer manifest (`hisparse_plan.exchange.manifest`), an SGLang plan's buffer views
(element strides and storage offsets). The lowering reads places another way (vLLM's layer
views, SGLang's page ranges), so a slip in either shows as a refused program."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from math import prod

from hisparse_plan.errors import PlanError
from hisparse_plan.exchange.manifest import manifest
from hisparse_plan.exchange.transfer.sglang_facts import HOST_POOL, region_name, table_of
from hisparse_plan.exchange.transfer.vllm_facts import table_key
from hisparse_plan.models import DTYPE_SIZE, MambaSpec, MLASpec
from hisparse_plan.models.any_plan import Plan
from hisparse_plan.models.plan import KVCachePlan
from hisparse_plan.models.pools import BUFFER_DTYPE_SIZE, BufferView
from hisparse_plan.models.sglang_plan import SGLangPlan
from hisparse_plan.views import spec_of

Origin = Callable[[str], int]
"""A layer's first global head on this rank."""


@dataclass(frozen=True, slots=True)
class Axis:
    kind: str
    """layer, block, head or unit."""
    stride: int
    extent: int


@dataclass(frozen=True, slots=True)
class Pattern:
    """Logical byte `lo + c` of (layers[l], block b, local head h, unit n of the block) is at
    `base + l * S_layer + b * S_block + h * S_head + n * S_unit + c` of `region`, c < size."""

    region: str
    base: int
    size: int
    lo: int
    layers: tuple[str, ...]
    head_origin: int
    units: int
    table: str
    axes: tuple[Axis, ...]
    state: bool = False
    """A Mamba state: the request's last block of its table holds it."""

    def axis(self, kind: str) -> Axis | None:
        return next((axis for axis in self.axes if axis.kind == kind), None)


def patterns(plan: Plan, wanted: set[str], origin: Origin) -> dict[str, list[Pattern]]:
    """Every pattern of the layers in `wanted`, by region."""
    found = _vllm(plan, wanted, origin) if isinstance(plan, KVCachePlan) else _sglang(
        plan, wanted, origin)
    by_region: dict[str, list[Pattern]] = {}
    for pattern in found:
        by_region.setdefault(pattern.region, []).append(pattern)
    return by_region


def region_sizes(plan: Plan) -> list[tuple[str, int, str]]:
    """(name, bytes, location) of every allocation of the plan: a pool's one buffer, or each
    layer's buffer of an SGLang per-layer pool."""
    if isinstance(plan, KVCachePlan):
        return [(pool.name, pool.size, pool.location) for pool in plan.pools]
    return [(region_name(pool, layer), pool.size, pool.location)
            for pool in plan.pools for layer in plan.allocation_layers(pool)]


def _axes(*axes: Axis) -> tuple[Axis, ...]:
    """Axes that address something, widest stride first (a block axis always stays)."""
    kept = [axis for axis in axes if axis.extent > 1 or axis.kind == "block"]
    return tuple(sorted(kept, key=lambda axis: -axis.stride))


def _vllm(plan: KVCachePlan, wanted: set[str], origin: Origin) -> list[Pattern]:
    specs = spec_of(plan)
    entries = [entry for entry in manifest(plan).layers if entry.name in wanted]
    groups: dict[int, set[int]] = {}
    for entry in entries:
        groups.setdefault(entry.tensor, set()).add(entry.group)
    found: list[Pattern] = []
    seen: set[int] = set()
    for entry in entries:
        if entry.tensor in seen:
            continue
        tensor = plan.tensors[entry.tensor]
        if len(groups[entry.tensor]) == 1 and wanted.issuperset(tensor.layers):
            # The tensor's layers are one layer axis of one block table.
            seen.add(entry.tensor)
            names = tuple(tensor.layers)
            base = entry.offset - names.index(entry.name) * tensor.layer_stride
        else:
            names, base = (entry.name,), entry.offset
        layer = Axis("layer", tensor.layer_stride, len(names))
        block = Axis("block", entry.block_stride, entry.num_blocks)
        spec = specs[entry.name][1]
        table = table_key(entry.group)
        head = origin(entry.name)
        if isinstance(spec, MambaSpec):
            found.extend(_states(spec, tensor.pool, base, names, head, table,
                                 _axes(layer, block)))
            continue
        heads, units, elements = entry.block_shape
        head_stride, unit_stride, element = entry.block_strides
        row = elements * element
        if isinstance(spec, MLASpec) and spec.cache_role == "indexer":
            if heads != 1 or (units > 1 and unit_stride != row):
                raise PlanError(f"layer {entry.name!r}: index-key pages are not contiguous "
                                f"(strides {entry.block_strides}); expected one head, rows "
                                "back to back", field=f"layers[{entry.name!r}]")
            found.append(Pattern(tensor.pool, base, units * row, 0, names, head, 1, table,
                                 _axes(layer, block)))
            continue
        found.append(Pattern(
            tensor.pool, base, row, 0, names, head, units, table,
            _axes(layer, block, Axis("head", head_stride, heads),
                  Axis("unit", unit_stride, units)),
        ))
    return found


def _part_order(view: str) -> int:
    """Where a buffer's field sits in the logical row: K before V; conv states (in order)
    before the temporal state."""
    if view == "v_buffer":
        return 1
    if view.startswith("conv["):
        return int(view[5:].rstrip("]"))
    return 1000 if view == "temporal" else 0


def _states(spec: MambaSpec, region: str, base: int, names: tuple[str, ...], head: int,
            table: str, axes: tuple[Axis, ...]) -> list[Pattern]:
    """A Mamba page's states, each rounded up to state_alignment: one pattern per run of
    states that follow one another without a gap."""
    runs: list[tuple[int, int, int]] = []
    at = lo = 0
    for shape, dtype in zip(spec.state_shapes, spec.state_dtypes, strict=True):
        size = prod(shape) * DTYPE_SIZE[dtype]
        if runs and runs[-1][0] + runs[-1][1] == at:
            runs[-1] = (runs[-1][0], runs[-1][1] + size, runs[-1][2])
        else:
            runs.append((at, size, lo))
        lo += size
        at += -(-size // spec.state_alignment) * spec.state_alignment
    return [Pattern(region, base + at, size, lo, names, head, 1, table, axes, state=True)
            for at, size, lo in runs]


def _sglang(plan: SGLangPlan, wanted: set[str], origin: Origin) -> list[Pattern]:
    pools = {pool.name: pool for pool in plan.pools}
    hosted = {name for tensor in plan.tensors if tensor.pool == HOST_POOL
              for name in tensor.layers}
    drafts: list[tuple[int, Pattern]] = []
    parts: dict[str, dict[int, int]] = {}
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
            nbytes, units, axes = _row_axes(view, 1 if whole else 0, page, size,
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
                drafts.append((order, Pattern(region, base, nbytes, 0, layers,
                                              origin(layers[0]), units, table, _axes(*axes),
                                              state=table == "mamba")))
    return [
        _at(pattern, sum(size for key, size in parts[pattern.layers[0]].items() if key < order))
        for order, pattern in drafts
    ]


def _at(pattern: Pattern, lo: int) -> Pattern:
    return Pattern(pattern.region, pattern.base, pattern.size, lo, pattern.layers,
                   pattern.head_origin, pattern.units, pattern.table, pattern.axes,
                   pattern.state)


def _row_axes(view: BufferView, lead: int, page: int, size: int, state: bool
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
