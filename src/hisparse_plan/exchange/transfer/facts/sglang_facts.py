"""An SGLang plan (`SGLangPlan`) as transfer facts: each family of pools that shares token (or
slot) ids a block table, each layer's fields placed through its tensor's page ranges and its
buffers' strides."""

from __future__ import annotations

from dataclasses import replace
from math import prod
from typing import Final

from hisparse_plan.exchange.transfer.facts.rank_facts import (
    FieldPlace,
    LayerFacts,
    RankFacts,
    RegionFacts,
    TableFacts,
)
from hisparse_plan.models.pools import BUFFER_DTYPE_SIZE, BufferView, Pool
from hisparse_plan.models.sglang_plan import SGLangPlan

HOST_POOL: Final = "hisparse_host"
TABLES: Final[dict[str, str]] = {
    "kv": "full", "kv_v": "full", "index": "full", "swa": "swa",
    "mamba_temporal": "mamba", HOST_POOL: HOST_POOL,
}
"""Pools that share ids share a table: the full pool's token ids index K/V, latent rows and
index keys alike; the window pool has ids of its own, Mamba request slots theirs, and the
HiSparse host pool its host token ids."""
FIELDS: Final[dict[str, str]] = {
    "k_buffer": "k", "v_buffer": "v", "kv_buffer": "latent", "host_kv_buffer": "latent",
    "index_k": "index", "temporal": "state",
}


def region_name(pool: Pool, layer: str | None) -> str:
    """A whole pool's one allocation is named by the pool; a per-layer pool's by pool/layer."""
    return pool.name if layer is None else f"{pool.name}/{layer}"


def table_of(pool: str) -> str | None:
    if pool.startswith("mamba_conv"):
        return "mamba"
    return TABLES.get(pool)


def sglang_facts(plan: SGLangPlan) -> RankFacts:
    pools = {pool.name: pool for pool in plan.pools}
    regions: dict[str, RegionFacts] = {}
    for pool in plan.pools:
        for layer in plan.allocation_layers(pool):
            name = region_name(pool, layer)
            regions[name] = RegionFacts(name, pool.name, layer, pool.location, pool.size)
    hosted = {
        layer for tensor in plan.tensors if tensor.pool == HOST_POOL for layer in tensor.layers
    }
    parts: dict[str, list[tuple[str, FieldPlace]]] = {}
    tensor_of: dict[str, int] = {}
    kinds: dict[str, tuple[str, int, int, int]] = {}
    tables: dict[str, TableFacts] = {}
    unsupported: dict[str, str] = {}
    for index, tensor in enumerate(plan.tensors):
        pool = pools[tensor.pool]
        table = table_of(pool.name)
        if table is None:
            for layer in tensor.layers:
                unsupported[layer] = f"SGLang's {pool.name} pool (DeepSeek-V4)"
            continue
        if pool.name in ("kv", "kv_v") and plan.hisparse is not None \
                and set(tensor.layers) <= hosted:
            # HiSparse's device rows are copies it makes from the host pool, which holds every
            # token: the host pool is where a request's rows are moved.
            continue
        _table(tables, table, pool)
        for position, layer in enumerate(tensor.layers):
            layer_base = tensor.offset + position * tensor.layer_stride
            region = region_name(pool, None if pool.allocation == "whole" else layer)
            ranges = tensor.ranges or []
            for part, view in enumerate(tensor.views):
                start = layer_base + (ranges[part].offset if part < len(ranges) else 0)
                field, kind = _field(view, pool, region, start, tensor.block_stride)
                parts.setdefault(layer, []).append((table, field))
                kinds[layer] = kind
                tensor_of.setdefault(layer, index)
    layers = {name: replace(_layer(name, parts[name], kinds[name]), tensor=tensor_of[name])
              for name in parts}
    for name, why in unsupported.items():
        layers.setdefault(name, LayerFacts(name, "", "tokens", 1, 1, 1, True, None, (),
                                           unsupported=why))
    return RankFacts("sglang", layers, tables, regions)


def _table(tables: dict[str, TableFacts], key: str, pool: Pool) -> None:
    """A table's blocks are the fewest any of its pools holds (HiSparse's index pool is sized
    by logical tokens, its device latent pool by fewer)."""
    state = key == "mamba"
    tokens = 1 if state else pool.block_tokens or 1
    known = tables.get(key)
    blocks = pool.num_blocks if known is None else min(known.num_blocks, pool.num_blocks)
    tables[key] = TableFacts(key, tokens, blocks, pool.padding_blocks, state)


def _field(
    view: BufferView, pool: Pool, region: str, start: int, block_stride: int
) -> tuple[FieldPlace, tuple[str, int, int, int]]:
    """One buffer as a field: (place, (kind, units per block, tokens per unit, heads))."""
    size = BUFFER_DTYPE_SIZE[view.dtype]
    name = FIELDS.get(view.name, "state" if view.name.startswith("conv") else view.name)
    tokens = pool.block_tokens or 1
    if name == "state":
        shape = tuple(view.shape[2:])
        field = FieldPlace(view.name, 0, prod(shape) * size, view.dtype, shape, region, start,
                           block_stride, 0, 0)
        return field, ("state", 1, 0, 1)
    if name == "index":
        field = FieldPlace(name, 0, view.shape[-1] * size, view.dtype, (), region, start,
                           block_stride, 0, 0)
        return field, ("pages", 1, tokens, 1)
    # Rows: [..., token slots, heads, row elements]; a host buffer leads with its layers.
    slot_stride, head_stride = view.strides[-3] * size, view.strides[-2] * size
    field = FieldPlace(name, 0, view.shape[-1] * size, view.dtype, (), region, start,
                       block_stride, slot_stride, head_stride)
    return field, ("tokens", tokens, 1, view.shape[-2])


def _layer(name: str, parts: list[tuple[str, FieldPlace]], kind: tuple[str, int, int, int]
           ) -> LayerFacts:
    """A layer from its fields: K before V, conv states before the temporal one, each at its
    place in the logical row."""
    order = {"k": 0, "v": 1, "latent": 0, "index": 0}
    ordered = sorted(parts, key=lambda part: (order.get(part[1].name, 0),
                                              part[1].name == "temporal"))
    fields: list[FieldPlace] = []
    lo = 0
    is_state = kind[0] == "state"
    for index, (_, field) in enumerate(ordered):
        label = f"state{index}" if is_state else field.name
        fields.append(FieldPlace(label, lo, field.size, field.dtype, field.shape, field.region,
                                 field.base, field.block_stride, field.unit_stride,
                                 field.head_stride))
        lo += field.size
    table = ordered[0][0]
    state_kind, units, tokens, heads = kind
    latent = fields[0].name in ("latent", "index")
    return LayerFacts(
        name, table, "state" if is_state else "pages" if state_kind == "pages" else "tokens",
        units, tokens, heads, latent, None, tuple(fields), windowed=table == "swa",
    )
