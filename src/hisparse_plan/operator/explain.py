"""Every number of a plan, with the formula and the inputs it came from.

Each step is recomputed here with the planner's own helpers (`required_blocks`,
`host_block_stride`, `device_bytes_per_block`, `axis_strides`, ...) from the request and the
plan, and must agree with the number the plan carries: an explanation that disagreed with its
plan would be worse than none, so a disagreement raises `PlanInvariantError`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Final

from hisparse_plan.errors import PlanError, PlanInvariantError
from hisparse_plan.models import (
    RESIDENT_SUFFIX,
    AttentionLayerSpec,
    Axis,
    HisparseHotSpec,
    HisparseResidentSpec,
    KVCacheLayout,
    KVCachePlan,
    LayerSpec,
    MLASpec,
    PlanRequest,
    UniformTypeSpec,
    dtype_size,
)
from hisparse_plan.models.base import Model
from hisparse_plan.models.layer_specs import KVLayerSpec
from hisparse_plan.operator.bounds import pool_bounds
from hisparse_plan.planning import plan as make_plan
from hisparse_plan.planning.buckets import PlacedGroup, SpecBucket, place
from hisparse_plan.planning.capacity import ACTIVE_TAIL_PAGES
from hisparse_plan.planning.hot import hot_buffer_rows
from hisparse_plan.planning.pools import (
    SHARED_POOL_ALIGNMENT,
    SPARE_HOST_BLOCKS,
    device_bytes_per_block,
    host_block_stride,
    host_blocks_needed,
    host_budget_bytes,
)
from hisparse_plan.planning.strides import axis_strides
from hisparse_plan.presets import KVDtype, ModelArchitecture, row_geometry
from hisparse_plan.presets.kv_dtypes import FP8_TILE, SCALE_BYTES

Number = int | float
Inputs = dict[str, int | float | str]
HOST_LAYOUT: Final = KVCacheLayout.LBNHC
GROUP_NOUNS: Final = {"hisparse_resident": "resident", "hisparse_hot": "hot"}


class Step(Model):
    """`name` = `formula` (over `inputs`) = `value`."""

    name: str
    value: Number
    formula: str
    inputs: Inputs


class Section(Model):
    title: str
    steps: list[Step]


class Explanation(Model):
    sections: list[Section]

    def step(self, name: str) -> Step:
        """The step called `name` (KeyError when there is none)."""
        for section in self.sections:
            for step in section.steps:
                if step.name == name:
                    return step
        raise KeyError(name)


def explain(
    request: PlanRequest,
    *,
    architecture: ModelArchitecture | None = None,
    kv_dtype: KVDtype | None = None,
) -> Explanation:
    """Plan `request` and explain every number of the plan.

    With the `architecture` (and `kv_dtype`) the request was built from, a first section
    derives the layer geometry from the model's config.json fields.
    """
    plan = make_plan(request)
    if plan.host_pool is None or request.hisparse is None:
        raise PlanError("explain covers HiSparse plans only", field="hisparse")
    placed = [place(group) for group in plan.groups]
    sections = []
    if architecture is not None:
        sections.append(_config_section(request, architecture, kv_dtype or "fp8_ds_mla"))
    sections += [
        _pages_section(request),
        _groups_section(request, plan, placed),
        _host_section(request, plan, placed[0]),
        _device_section(plan, placed[1:]),
        _tensors_section(plan, placed),
        _capacity_section(plan),
    ]
    return Explanation(sections=sections)


def _agree(name: str, computed: Number, planned: Number) -> None:
    same = (
        math.isclose(computed, planned, rel_tol=1e-12)
        if isinstance(computed, float) or isinstance(planned, float)
        else computed == planned
    )
    if not same:
        raise PlanInvariantError(f"{name}: the plan says {planned}, its inputs give {computed}")


def _step(
    name: str, value: Number, formula: str, planned: Number | None = None,
    **inputs: int | float | str,
) -> Step:
    if planned is not None:
        _agree(name, value, planned)
    return Step(name=name, value=value, formula=formula, inputs=inputs)


def _config_section(request: PlanRequest, arch: ModelArchitecture, kv_dtype: KVDtype) -> Section:
    geometry = row_geometry(arch, kv_dtype)
    leaders = arch.leaders()
    if arch.sharing_source == "index_topk_freq":
        sharing = "layers i with max(i - index_skip_topk_offset + 1, 0) % index_topk_freq == 0"
        sharing_inputs: Inputs = {
            "num_hidden_layers": arch.num_hidden_layers,
            "index_topk_freq": arch.index_topk_freq,
            "index_skip_topk_offset": arch.index_skip_topk_offset,
        }
    else:
        sharing = f"layers marked as running their own indexer in {arch.sharing_source}"
        sharing_inputs = {"num_hidden_layers": arch.num_hidden_layers}
    if kv_dtype == "fp8_ds_mla":
        row = _step(
            "sparse row bytes (fp8_ds_mla)", geometry.sparse_row_bytes,
            f"kv_lora_rank * 1 (fp8) + kv_lora_rank / {FP8_TILE} * {SCALE_BYTES} (float32 "
            "scales) + qk_rope_head_dim * 2 (bfloat16)",
            kv_lora_rank=arch.kv_lora_rank, qk_rope_head_dim=arch.qk_rope_head_dim,
        )
        indexer_row = _step(
            "indexer row bytes (fp8_ds_mla)", geometry.indexer_row_bytes,
            f"index_head_dim * 1 (fp8) + index_head_dim / {FP8_TILE} * {SCALE_BYTES} "
            "(float32 scales)",
            index_head_dim=arch.index_head_dim,
        )
    else:
        row = _step(
            "sparse row bytes (bfloat16)", geometry.sparse_row_bytes,
            "(kv_lora_rank + qk_rope_head_dim) * 2",
            kv_lora_rank=arch.kv_lora_rank, qk_rope_head_dim=arch.qk_rope_head_dim,
        )
        indexer_row = _step(
            "indexer row bytes (bfloat16)", geometry.indexer_row_bytes, "index_head_dim * 2",
            index_head_dim=arch.index_head_dim,
        )
    length = request.model.max_model_len
    if length == arch.max_position_embeddings:
        length_step = _step(
            "max_model_len", length, "max_position_embeddings",
            max_position_embeddings=arch.max_position_embeddings,
        )
    else:
        length_step = _step(
            "max_model_len", length, "chosen (below or above max_position_embeddings)",
            max_position_embeddings=arch.max_position_embeddings,
        )
    return Section(
        title="model config (config.json fields)",
        steps=[
            _step("sparse layers", len(leaders), "num_hidden_layers",
                  num_hidden_layers=arch.num_hidden_layers),
            Step(name="indexer layers", value=sum(leaders), formula=sharing,
                 inputs=sharing_inputs),
            _step("head_size", geometry.head_size, "kv_lora_rank + qk_rope_head_dim",
                  kv_lora_rank=arch.kv_lora_rank, qk_rope_head_dim=arch.qk_rope_head_dim),
            row,
            indexer_row,
            _step("index_topk", request.model.index_topk, "index_topk",
                  index_topk=arch.index_topk),
            length_step,
        ],
    )


def _pages_section(request: PlanRequest) -> Section:
    """One page per distinct layer spec: the request shares one object per distinct spec."""
    counts: Counter[int] = Counter(id(spec) for spec in request.layers.values())
    steps = []
    seen: set[int] = set()
    for name, spec in request.layers.items():
        if id(spec) in seen:
            continue
        seen.add(id(spec))
        more = counts[id(spec)] - 1
        label = f"{name}" + (f" (and {more} more like it)" if more else "")
        steps.append(_content_step(label, spec))
        steps.append(
            _step(
                f"page of {label}",
                spec.num_kv_heads * spec.block_size * spec.content_bytes,
                "num_kv_heads * block_size * content_bytes",
                spec.page_size_bytes,
                num_kv_heads=spec.num_kv_heads, block_size=spec.block_size,
                content_bytes=spec.content_bytes,
            )
        )
    return Section(title="pages (SPEC 5.1)", steps=steps)


def _content_step(label: str, spec: AttentionLayerSpec) -> Step:
    name = f"content_bytes of {label}"
    size = dtype_size(spec.dtype)
    if isinstance(spec, MLASpec):
        if spec.state_content_bytes is not None:
            return _step(name, spec.state_content_bytes, "state_content_bytes",
                         spec.content_bytes, state_content_bytes=spec.state_content_bytes)
        return _step(name, spec.head_size * size, "head_size * dtype_size", spec.content_bytes,
                     head_size=spec.head_size, dtype_size=size)
    if isinstance(spec, KVLayerSpec):
        value_size = spec.value_head_size
        return _step(name, (spec.head_size + value_size) * size,
                     "(head_size + head_size_v) * dtype_size", spec.content_bytes,
                     head_size=spec.head_size, head_size_v=value_size, dtype_size=size)
    raise PlanError(f"{label}: no content formula for layer kind {spec.kind!r}")


def _bucket_terms(buckets: Sequence[SpecBucket]) -> str:
    return " + ".join(f"{len(b.names)} * {b.spec.page_size_bytes}" for b in buckets)


def _groups_section(request: PlanRequest, plan: KVCachePlan, placed: list[PlacedGroup]) -> Section:
    hisparse = request.hisparse
    if hisparse is None:
        raise PlanError("explain covers HiSparse plans only", field="hisparse")
    source, indexer = placed[0], placed[1]
    source_specs = [b.spec for b in source.buckets if isinstance(b.spec, MLASpec)]
    block_size = source.group.spec.block_size
    rows, _ = hot_buffer_rows(source_specs, request.model, hisparse, block_size)
    widths = {s.topk_buffer_width for s in source_specs if s.topk_buffer_width is not None}
    top_k = max(
        request.model.index_topk if s.topk_buffer_width is None else s.topk_buffer_width
        for s in source_specs
    )
    queries = hisparse.max_decode_query_len
    residents = [p for p in placed if isinstance(p.group.spec, HisparseResidentSpec)]
    hots = [p for p in placed if isinstance(p.group.spec, HisparseHotSpec)]
    source_spec = source.group.spec
    members = source_spec.specs if isinstance(source_spec, UniformTypeSpec) else {}
    units = sum(
        1 for position, spec in enumerate(members.values())
        if position == 0 or (isinstance(spec, MLASpec) and spec.is_index_group_leader)
    )
    hot_spec = hots[0].group.spec if hots else None
    steps = [
        _step("source page", source.block_bytes, "sum of the source layers' pages: "
              + _bucket_terms(source.buckets), source.group.spec.page_size_bytes,
              layers=len(source.group.layer_names)),
        _step("indexer page", indexer.block_bytes, "sum of the indexer layers' pages: "
              + _bucket_terms(indexer.buckets), indexer.group.spec.page_size_bytes,
              layers=len(indexer.group.layer_names)),
        _step("top_k", top_k,
              "max over source layers of topk_buffer_width, else index_topk",
              index_topk=request.model.index_topk,
              **({"topk_buffer_width": max(widths)} if widths else {})),
        _step("device_buffer_size", rows,
              "configured" if hisparse.device_buffer_size is not None
              else "(max_decode_query_len + 1) * top_k",
              max_decode_query_len=queries, top_k=top_k,
              minimum=queries * top_k),
        _step("hot blocks_per_request", -(-rows // block_size),
              "ceil(device_buffer_size / block_size)",
              hot_spec.blocks_per_request if isinstance(hot_spec, HisparseHotSpec) else None,
              device_buffer_size=rows, block_size=block_size),
        *_pack_page_steps(residents, members),
        _step("resident/hot packs", len(residents),
              "index-sharing units (a leader and the layers after it) packed in order while "
              "a pack's pages fit in one indexer page",
              units=units, indexer_page=indexer.block_bytes,
              layers_per_pack=", ".join(str(len(p.group.layer_names)) for p in residents)),
    ]
    return Section(title="groups and hot buffer (SPEC 5.4-5.6)", steps=steps)


def _pack_page_steps(
    residents: list[PlacedGroup], sources: Mapping[str, LayerSpec]
) -> list[Step]:
    """One step per page size among the packs: a pack's resident and hot pages are the page of
    its source layers, which must all be one size."""
    by_page: dict[int, list[PlacedGroup]] = {}
    for pack in residents:
        by_page.setdefault(pack.group.spec.page_size_bytes, []).append(pack)
    steps = []
    for page, packs in by_page.items():
        first = packs[0].group.layer_names[0].removesuffix(RESIDENT_SUFFIX)
        source = sources.get(first)
        steps.append(
            _step(f"resident/hot page ({len(packs)} pack{'s' if len(packs) > 1 else ''})",
                  page if source is None else source.page_size_bytes,
                  "the page of the pack's source layers", page, first=first)
        )
    return steps


def _host_section(request: PlanRequest, plan: KVCachePlan, source: PlacedGroup) -> Section:
    host = plan.host_pool
    hisparse = request.hisparse
    if host is None or hisparse is None:
        raise PlanError("explain covers HiSparse plans only", field="hisparse")
    page = source.group.spec.page_size_bytes
    stride = host_block_stride(page, host.shared)
    budget = host_budget_bytes(hisparse.host_pool_gib)
    workload = plan.workload
    needed = host_blocks_needed(workload.max_model_len, source.group.spec.block_size)
    return Section(
        title="host pool (SPEC 5.7)",
        steps=[
            _step("host_pool.budget_bytes", budget, "int(host_pool_gib * 2**30)",
                  host.budget_bytes, host_pool_gib=hisparse.host_pool_gib),
            _step("host_pool.block_stride", stride,
                  f"round_up(source_page, {SHARED_POOL_ALIGNMENT}) (a shared pool is an mmap)"
                  if host.shared else "source_page",
                  host.block_stride, source_page=page),
            _step("host_pool.num_blocks", budget // stride, "budget_bytes // block_stride",
                  host.num_blocks, budget_bytes=budget, block_stride=stride),
            _step("host blocks needed", needed,
                  f"ceil(max_model_len / block_size) + {SPARE_HOST_BLOCKS} (null block and "
                  "copy-on-write tail); the pool must have at least this many",
                  max_model_len=workload.max_model_len,
                  block_size=source.group.spec.block_size),
            _step("host_pool.bytes_per_block", page, "source_page", host.bytes_per_block,
                  source_page=page),
            _step("host_pool.size", page * host.num_blocks, "bytes_per_block * num_blocks",
                  host.size, bytes_per_block=page, num_blocks=host.num_blocks),
        ],
    )


def _device_section(plan: KVCachePlan, device: list[PlacedGroup]) -> Section:
    pool = plan.device_pool
    layout = pool.layout
    largest = max(device, key=lambda group: group.block_bytes)
    per_block = device_bytes_per_block(device, layout)
    hot_pages = sorted({
        g.group.spec.page_size_bytes for g in device if isinstance(g.group.spec, HisparseHotSpec)
    })
    if layout.block_outermost and hot_pages:
        formula = "round_up(largest device group block, lcm(hot pages))"
        inputs: Inputs = {
            "largest device group block": largest.block_bytes,
            "lcm(hot pages)": math.lcm(*hot_pages),
            "layout": layout.value,
        }
    else:
        formula = "largest device group block"
        inputs = {"largest device group block": largest.block_bytes, "layout": layout.value}
    if pool.num_blocks_override is not None:
        blocks = _step("num_blocks", pool.num_blocks_override, "num_blocks_override",
                       plan.num_blocks, num_blocks_override=pool.num_blocks_override)
    else:
        blocks = _step("num_blocks", pool.available_bytes // per_block,
                       "available_bytes // bytes_per_block", plan.num_blocks,
                       available_bytes=pool.available_bytes, bytes_per_block=per_block)
    return Section(
        title="device pool (SPEC 5.8)",
        steps=[
            _step("largest device group block", largest.block_bytes,
                  "max over device groups of the sum of their layers' pages",
                  group=largest.group.layer_names[0]),
            Step(name="device_pool.bytes_per_block", value=per_block, formula=formula,
                 inputs=inputs),
            blocks,
            _step("device_pool.size", per_block * plan.num_blocks,
                  "bytes_per_block * num_blocks", pool.size,
                  bytes_per_block=per_block, num_blocks=plan.num_blocks),
        ],
    )


def _tensors_section(plan: KVCachePlan, placed: list[PlacedGroup]) -> Section:
    host = plan.host_pool
    if host is None:
        raise PlanError("explain covers HiSparse plans only", field="hisparse")
    pools = [(placed[0], HOST_LAYOUT, host.num_blocks, host.bytes_per_block)]
    pools += [
        (group, plan.device_pool.layout, plan.num_blocks, plan.device_pool.bytes_per_block)
        for group in placed[1:]
    ]
    steps: list[Step] = []
    index = 0
    for group, layout, num_blocks, per_block in pools:
        byte_offset = 0
        for bucket in group.buckets:
            if index >= len(plan.tensors):
                raise PlanInvariantError(f"the plan has {len(plan.tensors)} tensors; expected more")
            tensor = plan.tensors[index]
            steps += _tensor_steps(index, tensor.layer_stride, tensor.block_stride, tensor.offset,
                                   bucket, layout, num_blocks, per_block, byte_offset)
            byte_offset += bucket.block_bytes
            index += 1
    return Section(title="tensors (SPEC 5.9)", steps=steps)


def _tensor_steps(
    index: int, layer_stride: int, block_stride: int, offset: int, bucket: SpecBucket,
    layout: KVCacheLayout, num_blocks: int, per_block: int, byte_offset: int,
) -> list[Step]:
    spec = bucket.spec
    page = spec.page_size_bytes
    name = f"tensors[{index}]"
    first = bucket.names[0]
    if isinstance(spec, HisparseResidentSpec | HisparseHotSpec):
        strides = (
            _step(f"{name}.layer_stride", page, "page", layer_stride, page=page,
                  layers=len(bucket.names), first=first),
            _step(f"{name}.block_stride", per_block, "device bytes_per_block", block_stride,
                  bytes_per_block=per_block),
        )
    else:
        extents: dict[Axis, int] = {
            "L": len(bucket.names), "B": num_blocks, "H": spec.num_kv_heads,
            "N": spec.block_size, "C": spec.content_bytes,
        }
        fixed: dict[Axis, int] = {"B": per_block} if layout.block_outermost else {}
        axes = axis_strides(layout, extents, fixed)
        shape = ", ".join(f"{axis}={extents[axis]}" for axis in layout.axes)
        pinned = ", B stride fixed to bytes_per_block" if fixed else ""
        strides = (
            _step(f"{name}.layer_stride", axes["L"],
                  f"stride of L in {layout.value} over [{shape}]{pinned}", layer_stride,
                  layers=len(bucket.names), first=first),
            _step(f"{name}.block_stride", axes["B"],
                  f"stride of B in {layout.value} over [{shape}]{pinned}", block_stride,
                  **({"bytes_per_block": per_block} if fixed else {})),
        )
    stride = strides[0].value
    return [
        *strides,
        _step(f"{name}.offset", byte_offset * max(int(stride), page) // page,
              "byte_offset * max(layer_stride, page) // page", offset,
              byte_offset=byte_offset, layer_stride=stride, page=page),
    ]


def _capacity_section(plan: KVCachePlan) -> Section:
    bounds = pool_bounds(plan)
    workload = plan.workload
    terms: Counter[tuple[str, int, int]] = Counter()
    for demand in bounds.demands:
        group = plan.groups[demand.group]
        group_kind: str = "indexer" if group.role == "hisparse_indexer" else group.spec.kind
        terms[(group_kind, demand.blocks, demand.steady_blocks)] += 1
    steps = []
    for (kind, blocks, _), count in terms.items():
        steps.append(_demand_step(kind, blocks, count, plan))
    admission = " + ".join(f"{count} * {blocks}" for (_, blocks, _), count in terms.items())
    steady = " + ".join(f"{count} * {steady}" for (_, _, steady), count in terms.items())
    device_max = bounds.device_bound("max")
    device_steady = bounds.device_bound("steady")
    host = bounds.host_bound
    capacity = plan.capacity
    steps += [
        _step("admission blocks", bounds.admission, "sum of device groups' blocks: " + admission),
        _step("steady blocks", bounds.steady,
              f"the same with each resident group capped at {ACTIVE_TAIL_PAGES}: " + steady),
        _step("host blocks per request", bounds.host_required,
              "ceil(max_model_len / block_size)", max_model_len=workload.max_model_len),
        _step("device bound", float(device_max), "num_blocks / admission blocks",
              num_blocks=bounds.num_blocks, admission=bounds.admission),
        _step("host bound", float(host), "host num_blocks / host blocks per request",
              host_blocks=bounds.host_blocks, per_request=bounds.host_required),
        _step("capacity.max_concurrency", float(min(device_max, host)),
              "min(device bound, host bound)", capacity.max_concurrency,
              binding=bounds.binding("max")),
        _step("device steady bound", float(device_steady),
              "num_blocks / admission when num_blocks < admission, else "
              "1 + (num_blocks - admission) / steady",
              num_blocks=bounds.num_blocks, admission=bounds.admission, steady=bounds.steady),
        _step("capacity.steady_state_concurrency", float(min(device_steady, host)),
              "min(device steady bound, host bound)", capacity.steady_state_concurrency,
              binding=bounds.binding("steady")),
    ]
    return Section(title="capacity (SPEC 5.10)", steps=steps)


def _demand_step(kind: str, blocks: int, count: int, plan: KVCachePlan) -> Step:
    workload = plan.workload
    noun = GROUP_NOUNS.get(kind, kind)
    label = f"blocks per request, {count} {noun} group" + ("s" if count > 1 else "")
    if kind == "hisparse_resident":
        return _step(label, blocks,
                     "ceil(min(max_num_batched_tokens * max_concurrent_batches, max_model_len) "
                     "/ block_size)",
                     max_num_batched_tokens=workload.max_num_batched_tokens,
                     max_concurrent_batches=workload.max_concurrent_batches,
                     max_model_len=workload.max_model_len)
    if kind == "hisparse_hot":
        return _step(label, blocks, "blocks_per_request")
    return _step(label, blocks, "required_blocks (ceil(max_model_len / block_size) for MLA and "
                 "full attention)", max_model_len=workload.max_model_len)
