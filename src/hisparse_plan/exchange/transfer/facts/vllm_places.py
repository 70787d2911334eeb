"""check_transfer's reading of a vLLM plan's places: each layer's pattern from the plan's transfer
manifest (`hisparse_plan.exchange.manifest`), by arithmetic of its own; the lowering reads
vLLM's layer views instead, so a slip in either shows as a refused program."""

from __future__ import annotations

from math import prod

from hisparse_plan.errors import PlanError
from hisparse_plan.exchange.manifest import manifest
from hisparse_plan.exchange.transfer.facts.byte_layout import (
    Axis,
    ByteLayout,
    Origin,
    StatePieces,
    addressing,
)
from hisparse_plan.exchange.transfer.facts.vllm_facts import table_key
from hisparse_plan.models import DTYPE_SIZE, KVCachePlan, MambaSpec, MLASpec
from hisparse_plan.views import spec_of


def vllm_regions(plan: KVCachePlan) -> list[tuple[str, int, str]]:
    """(name, bytes, location) of every pool: each is one allocation."""
    return [(pool.name, pool.size, pool.location) for pool in plan.pools]


def vllm_patterns(plan: KVCachePlan, wanted: set[str], origin: Origin, pieces: StatePieces
                  ) -> list[ByteLayout]:
    specs = spec_of(plan)
    entries = [entry for entry in manifest(plan).layers if entry.name in wanted]
    groups: dict[int, set[int]] = {}
    for entry in entries:
        groups.setdefault(entry.tensor, set()).add(entry.group)
    found: list[ByteLayout] = []
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
                                 addressing(layer, block), pieces))
            continue
        heads, units, elements = entry.block_shape
        head_stride, unit_stride, element = entry.block_strides
        row = elements * element
        if isinstance(spec, MLASpec) and spec.cache_role == "indexer":
            if heads != 1 or (units > 1 and unit_stride != row):
                raise PlanError(f"layer {entry.name!r}: index-key pages are not contiguous "
                                f"(strides {entry.block_strides}); expected one head, rows "
                                "back to back", field=f"layers[{entry.name!r}]")
            found.append(ByteLayout(tensor.pool, base, units * row, 0, names, head, 1, table,
                                 addressing(layer, block)))
            continue
        found.append(ByteLayout(
            tensor.pool, base, row, 0, names, head, units, table,
            addressing(layer, block, Axis("head", head_stride, heads),
                  Axis("unit", unit_stride, units)),
        ))
    return found


def _states(spec: MambaSpec, region: str, base: int, names: tuple[str, ...], head: int,
            table: str, axes: tuple[Axis, ...], pieces: StatePieces) -> list[ByteLayout]:
    """A Mamba page's states, each rounded up to state_alignment: one pattern per run of
    bytes that follow one another both in the page and in the logical row (a state's pieces
    of the full state between TP sizes)."""
    runs: list[tuple[int, int, int]] = []
    at = lo = 0
    for index, (shape, dtype) in enumerate(zip(spec.state_shapes, spec.state_dtypes,
                                               strict=True)):
        size = prod(shape) * DTYPE_SIZE[dtype]
        cut, full = pieces(names[0], index, tuple(shape), size)
        for mine, theirs, length in cut:
            if runs and runs[-1][0] + runs[-1][1] == at + mine \
                    and runs[-1][2] + runs[-1][1] == lo + theirs:
                runs[-1] = (runs[-1][0], runs[-1][1] + length, runs[-1][2])
            else:
                runs.append((at + mine, length, lo + theirs))
        lo += full
        at += -(-size // spec.state_alignment) * spec.state_alignment
    return [ByteLayout(region, base + at, size, lo, names, head, 1, table, axes, state=True)
            for at, size, lo in runs]
