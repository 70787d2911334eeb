"""A vLLM plan (`KVCachePlan`) as transfer facts: each transferred group a block table, each
layer's fields placed through its per-layer view (`hisparse_plan.views`)."""

from __future__ import annotations

from dataclasses import replace

from hisparse_plan.exchange.movable import group_transferred, unmovable_kind
from hisparse_plan.exchange.transfer.facts.rank_facts import (
    FieldPlace,
    LayerFacts,
    RankFacts,
    RegionFacts,
    TableFacts,
)
from hisparse_plan.models import DTYPE_SIZE, KVCachePlan
from hisparse_plan.models.group_specs import GroupSpec
from hisparse_plan.models.layer_specs import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVLayerSpec,
    LatentLayerSpec,
    MambaSpec,
    MLASpec,
    SlidingWindowSpec,
)
from hisparse_plan.views import LayerView, plan_views, spec_of


def table_key(group: int) -> str:
    """A vLLM block table: the index of its KV cache group."""
    return f"group.{group}"


def vllm_facts(plan: KVCachePlan) -> RankFacts:
    specs = spec_of(plan)
    pools = {pool.name: pool for pool in plan.pools}
    regions = {
        pool.name: RegionFacts(pool.name, pool.name, None, pool.location, pool.size)
        for pool in plan.pools
    }
    tables: dict[str, TableFacts] = {}
    layers: dict[str, LayerFacts] = {}
    for view in plan_views(plan, specs).values():
        group = plan.groups[view.group]
        if not group_transferred(group):
            continue
        tensor = plan.tensors[view.tensor]
        key = table_key(view.group)
        if key not in tables:
            host = plan.host_pool if group.host_resident else None
            # A uniform_type group of Mamba layers is a state table too: judge by the member.
            tables[key] = TableFacts(
                key, group.spec.block_size,
                plan.num_blocks if host is None else host.num_blocks,
                pools[tensor.pool].padding_blocks,
                isinstance(specs[view.name][1], MambaSpec),
            )
        facts = layer_facts(view, specs[view.name][1], key, tensor.pool)
        layers[view.name] = replace(facts, tensor=view.tensor)
    return RankFacts("vllm", layers, tables, regions)


def layer_facts(view: LayerView, spec: GroupSpec, table: str, region: str) -> LayerFacts:
    """One layer's facts from its view: K/V rows, latent rows, index-key pages, states."""
    name = view.name
    refused = unmovable_kind(spec)  # the one decision manifest and diff read too
    if refused is not None:
        return LayerFacts(name, table, "tokens", 1, 1, 1, True, None, (), unsupported=refused)
    if isinstance(spec, MambaSpec):
        return _state(view, spec, table, region)
    _, heads, units, _ = view.shape
    block_stride, head_stride, unit_stride, _ = view.strides

    def place(field: str, lo: int, size: int, dtype: str) -> FieldPlace:
        return FieldPlace(field, lo, size, dtype, (), region, view.offset + lo, block_stride,
                          unit_stride, head_stride)

    if isinstance(spec, MLASpec) and spec.cache_role == "indexer":
        # Index keys are laid out per page (a page's fp8 keys, then their scales), so the page
        # is the unit; its units and heads are contiguous in every layout (one head).
        page = units * spec.content_bytes
        field = FieldPlace("index", 0, page, spec.dtype, (), region, view.offset, block_stride,
                           0, 0)
        return LayerFacts(name, table, "pages", 1, spec.block_size, 1, True, None, (field,))
    if isinstance(spec, LatentLayerSpec):
        latent = place("latent", 0, spec.content_bytes, spec.dtype)
        return LayerFacts(name, table, "tokens", units, 1, heads, True, spec.cache_dtype,
                          (latent,))
    if not isinstance(spec, KVLayerSpec):  # unmovable_kind refused every other kind
        raise TypeError(f"layer {name!r}: no rows for a {type(spec).__name__}")
    size = DTYPE_SIZE[spec.dtype]
    k_bytes, v_bytes = spec.head_size * size, spec.value_head_size * size
    fields = (place("k", 0, k_bytes, spec.dtype), place("v", k_bytes, v_bytes, spec.dtype))
    chunk = spec.attention_chunk_size if isinstance(spec, ChunkedLocalAttentionSpec) else None
    window: int | None
    if isinstance(spec, SlidingWindowSpec):
        window, windowed = spec.sliding_window, True
    elif isinstance(spec, FullAttentionSpec):
        # A window promoted to full blocks keeps (and is given) every block; its window is
        # recorded for a window layer on the other side.
        window, windowed = spec.sliding_window, False
    else:
        window, windowed = None, False
    return LayerFacts(name, table, "tokens", units, 1, heads, False, None, fields,
                      window=window, windowed=windowed, chunk=chunk)


def _state(view: LayerView, spec: MambaSpec, table: str, region: str) -> LayerFacts:
    """A Mamba layer's states, each rounded up to state_alignment inside the page; the logical
    row holds them back to back, unrounded."""
    fields: list[FieldPlace] = []
    at = lo = 0
    align = spec.state_alignment
    for index, (shape, dtype) in enumerate(zip(spec.state_shapes, spec.state_dtypes,
                                               strict=True)):
        size = DTYPE_SIZE[dtype]
        for extent in shape:
            size *= extent
        fields.append(FieldPlace(f"state{index}", lo, size, dtype, tuple(shape), region,
                                 view.offset + at, view.block_stride, 0, 0))
        lo += size
        at += -(-size // align) * align
    return LayerFacts(view.name, table, "state", 1, 0, 1, False, None, tuple(fields))
