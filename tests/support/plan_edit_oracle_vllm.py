"""The plan-edit oracle for vLLM plans: is a `KVCachePlan` sound, judged by enumeration and by
figures recomputed here from the groups and pools (never by check_plan, views.py or the
planner's rule functions).

What it deems sound (the contract it tests, from docs/plan-contract.md and
docs/planning-rules.md#invariants, #placement, #admission, #capacity, #host-pool):

Structure. Pools are exactly `host` (with a host pool) and one device pool per stage (`device`,
or `device.K`), each agreeing with its host_pool / device_pools entry (location, stage, whole
allocation, size, num_blocks, one padding block, sharing). Every group layer is placed by
exactly one tensor and every tensor layer belongs to a group; the HiSparse source group (role
hisparse_source, the only host-resident group) lives in host tensors of the host pool, every
other layer in the device pool of the one stage that lists it (stages that list layers, one
or more, list every device layer exactly once; one stage may list none); a tensor has its
pool's size, no page ranges and no views (vLLM's views follow from the specs). Cross-layer KV
sharing: a layer of `kv_sharing` is in no group; its target is a group layer of a default
(device) group whose spec is attention (not Mamba, resident or hot) and that itself reads no
other; no group spec (or uniform member) names a `kv_sharing_target`.

Bytes, per pool, enumerated. A layer's page of block b is the engine's view of it: attention
layers [H heads, N = block_size // compress_ratio tokens, C content bytes] with the strides the
pool's layout gives (walked innermost first, L and B pinned to the tensor's layer and block
strides, a padded page raising the walk at the inner of L and B), starting at
offset + position * layer_stride + b * block_stride; Mamba, resident and hot pages are byte
buffers of their used bytes (Mamba: each state rounded up to state_alignment). Every page,
padding included, lies in [0, pool size); offsets and strides of a view are whole elements of
its dtype (each Mamba state of its own). Two pages share a byte only when they are the same
block id of different groups: a vLLM block id belongs to one group at a time, so only the
other groups' pages at that same block id may overlay it; pages of one group never overlap
and pages of different block ids never do.

Figures. A page's bytes recomputed from its spec equal the spec's page_size_bytes. num_blocks is
the override, else the least available_bytes // bytes_per_block of the stages; each device
pool's size is bytes_per_block * num_blocks. The host pool: bytes_per_block is the source
group's page, block_stride that rounded up to 4096 when shared, num_blocks budget // stride,
size bytes_per_block * num_blocks, and one request of the plan's length plus 2 blocks fit. One
request of the plan's length (fitted_max_model_len, else max_model_len) fits beside the null
block: the blocks it holds in every device group (docs/planning-rules.md#admission) are at most
num_blocks - 1; a fitted length is at most the requested one and is the longest that fits
(device and host). HiSparse: top_k is the source layers' widest topk_buffer_width (else
index_topk), device_buffer_size in [q * top_k, 32768], the hot groups hold
ceil(device_buffer_size / block_size) blocks a request, resident and hot pages are their source
layer's page. Capacity: num_blocks over the blocks a request holds in every device group (and
at most host blocks over the source group's), and HiSparse's steady state with each resident
group at its last 2 pages; regular plans have no steady state.
"""

from __future__ import annotations

from hisparse_plan.models import KVCachePlan
from hisparse_plan.models.group_specs import (
    HisparseHotSpec,
    HisparseResidentSpec,
    UniformTypeSpec,
)
from hisparse_plan.models.layer_specs import (
    ChunkedLocalAttentionSpec,
    KVLayerSpec,
    MambaSpec,
    MLASpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
)
from hisparse_plan.models.plan import KVCacheGroup, KVCacheTensor, Workload
from hisparse_plan.models.pools import Pool
from support.plan_edit_faults import Faults, ceil_div, near, round_up
from support.plan_edit_vllm_bytes import Spec, page_of, stage_names, vllm_byte_faults

HOT_ROWS_LIMIT = 32768
HOST_SPARE_BLOCKS = 2
SHARED_HOST_ALIGN = 4096
RESIDENT_TAIL_PAGES = 2


def vllm_faults(plan: KVCachePlan) -> Faults:
    """Every fault found, stopping after the first section that finds one."""
    faults = Faults()
    specs = _layer_specs(plan, faults)
    if faults:
        return faults
    for section in (_structure, _sharing, _figures, vllm_byte_faults):
        section(plan, specs, faults)
        if faults:
            break
    return faults


def _layer_specs(plan: KVCachePlan, faults: Faults) -> dict[str, tuple[int, Spec]]:
    specs: dict[str, tuple[int, Spec]] = {}
    for index, group in enumerate(plan.groups):
        for name in group.layer_names:
            if name in specs:
                faults.add("layer placement", f"{name!r} is in two groups")
            spec: Spec = group.spec
            if isinstance(group.spec, UniformTypeSpec):
                member = group.spec.specs.get(name)
                if member is None:
                    faults.add("layer placement", f"{name!r} has no spec in its uniform group")
                    continue
                spec = member
            specs[name] = (index, spec)
    return specs


# --- structure ------------------------------------------------------------------------------


def _sharing(plan: KVCachePlan, specs: dict[str, tuple[int, Spec]], faults: Faults) -> None:
    for name, (_, spec) in specs.items():
        if getattr(spec, "kv_sharing_target", None) is not None:
            faults.add("kv sharing", f"group spec of {name!r} names a kv_sharing_target")
    for name, target in plan.kv_sharing.items():
        found = specs.get(target)
        if name in specs:
            faults.add("kv sharing", f"sharing layer {name!r} is in a group")
        elif target in plan.kv_sharing or found is None:
            faults.add("kv sharing", f"{name!r} reads {target!r}, not a placed own cache")
        elif plan.groups[found[0]].role != "default" or not isinstance(
                found[1], KVLayerSpec | MLASpec | SlidingWindowMLASpec):
            faults.add("kv sharing", f"{name!r} reads {target!r}, not a default attention layer")


def _structure(plan: KVCachePlan, specs: dict[str, tuple[int, Spec]], faults: Faults) -> None:
    pools = {pool.name: pool for pool in plan.pools}
    names = stage_names(plan)
    wanted = ([] if plan.host_pool is None else ["host"]) + names
    if sorted(p.name for p in plan.pools) != sorted(wanted):
        faults.add("pool names", f"pools {[p.name for p in plan.pools]}, expected {wanted}")
        return
    host = plan.host_pool
    if host is not None:
        _pool_is(pools["host"], "host", 0, host.size, host.num_blocks, host.shared, faults)
    for stage, (name, device) in enumerate(zip(names, plan.device_pools, strict=True)):
        _pool_is(pools[name], "device", stage, device.size, plan.num_blocks, False, faults)
    sources = [g for g in plan.groups if g.role == "hisparse_source"]
    for index, group in enumerate(plan.groups):
        if group.host_resident != (group.role == "hisparse_source"):
            faults.add("group role", f"groups[{index}] role {group.role} host_resident "
                       f"{group.host_resident}")
    if len(sources) > 1 or (len(sources) == 1) != (host is not None):
        faults.add("group role", f"{len(sources)} source groups, host pool {host is not None}")
    stage_of = _stage_of(plan, names, specs, faults)
    placed: dict[str, int] = {}
    for index, tensor in enumerate(plan.tensors):
        _tensor(plan, index, tensor, pools, specs, stage_of, placed, faults)
    missing = [name for name in specs if name not in placed]
    if missing:
        faults.add("layer placement", f"{missing[:3]} placed by no tensor")


def _pool_is(pool: Pool, location: str, stage: int, size: int, blocks: int, shared: bool,
             faults: Faults) -> None:
    want = {"location": location, "stage": stage, "allocation": "whole", "size": size,
            "num_blocks": blocks, "padding_blocks": 1, "shared": shared}
    for field, value in want.items():
        if getattr(pool, field) != value:
            faults.add(f"pool {field}", f"pool {pool.name!r}: {field} {getattr(pool, field)!r}, "
                       f"expected {value!r}")


def _stage_of(plan: KVCachePlan, names: list[str], specs: dict[str, tuple[int, Spec]],
              faults: Faults) -> dict[str, str]:
    """The device pool each device layer lives in."""
    device_layers = [n for n, (g, _) in specs.items() if not plan.groups[g].host_resident]
    if len(plan.device_pools) == 1 and plan.device_pools[0].layers is None:
        return dict.fromkeys(device_layers, names[0])
    # A request's device.pipeline_stages of one entry gives one stage that lists its layers
    # (the planner's own plan), held to the same rule as several stages.
    stage_of: dict[str, str] = {}
    for name, device in zip(names, plan.device_pools, strict=True):
        for layer in device.layers or []:
            if layer in stage_of or layer not in specs:
                faults.add("stage layers", f"{layer!r} listed twice or not a layer")
            stage_of[layer] = name
    if sorted(stage_of) != sorted(device_layers):
        faults.add("stage layers", "the stages do not list every device layer once")
    return stage_of


def _tensor(plan: KVCachePlan, index: int, tensor: KVCacheTensor, pools: dict[str, Pool],
            specs: dict[str, tuple[int, Spec]], stage_of: dict[str, str],
            placed: dict[str, int], faults: Faults) -> None:
    where = f"tensors[{index}]"
    pool = pools.get(tensor.pool)
    if pool is None:
        faults.add("tensor pool", f"{where} names pool {tensor.pool!r}")
        return
    if tensor.size != pool.size:
        faults.add("tensor size", f"{where} size {tensor.size}, pool {pool.size}")
    if tensor.host_resident != (pool.location == "host"):
        faults.add("tensor host_resident", f"{where} host_resident {tensor.host_resident} in "
                   f"{pool.location} pool")
    if tensor.ranges is not None or tensor.views:
        faults.add("tensor views", f"{where} states page ranges or views")
    for layer in tensor.layers:
        if layer in placed:
            faults.add("layer placement", f"{layer!r} placed twice")
        placed[layer] = index
        found = specs.get(layer)
        if found is None:
            faults.add("layer placement", f"{where} places {layer!r}, in no group")
            continue
        source = plan.groups[found[0]].host_resident
        home = "host" if source else stage_of.get(layer)
        if tensor.pool != home:
            faults.add("layer placement", f"{layer!r} in pool {tensor.pool!r}, expected {home!r}")


# --- figures --------------------------------------------------------------------------------


def required(spec: Spec, length: int, workload: Workload) -> int:
    """Blocks one request of `length` tokens holds in a group of this spec
    (docs/planning-rules.md#admission, #mamba-align-mode, #decode-context-parallelism)."""
    if isinstance(spec, UniformTypeSpec):
        return max(required(member, length, workload) for member in spec.specs.values())
    inflight = workload.max_num_batched_tokens * workload.max_concurrent_batches
    dcp = workload.decode_context_parallel_size
    if isinstance(spec, SlidingWindowSpec | SlidingWindowMLASpec):
        extra = max(0, workload.num_prefill_lookahead_tokens - 1)
        window = spec.sliding_window - 1 + extra + inflight
        return ceil_div(min(window, length), spec.block_size) + 1
    if isinstance(spec, ChunkedLocalAttentionSpec):
        return ceil_div(min(spec.attention_chunk_size + inflight, length), spec.block_size)
    if isinstance(spec, MambaSpec):
        if workload.mamba_cache_mode == "align":
            return 2 + spec.num_speculative_blocks + spec.num_prefill_checkpoint_blocks
        return 1 + spec.num_speculative_blocks
    if isinstance(spec, HisparseResidentSpec):
        return ceil_div(min(inflight, length), spec.block_size)
    if isinstance(spec, HisparseHotSpec):
        return spec.blocks_per_request
    if isinstance(spec, KVLayerSpec | MLASpec) and spec.dcp_sharded and dcp > 1:
        length = ceil_div(length, dcp)
    block_size = getattr(spec, "block_size", 1)
    return ceil_div(length, block_size)


def _figures(plan: KVCachePlan, specs: dict[str, tuple[int, Spec]], faults: Faults) -> None:
    for name, (_, spec) in specs.items():
        page = page_of(spec)
        declared = getattr(spec, "page_size_bytes", None)
        if page.footprint != declared:
            faults.add("page size", f"{name!r}: page {page.footprint}, spec says {declared}")
        if (isinstance(spec, SlidingWindowSpec | SlidingWindowMLASpec) and spec.dcp_sharded
                and plan.workload.decode_context_parallel_size > 1):
            faults.add("dcp window", f"{name!r}: a DCP-sharded window")
    override = plan.device_pools[0].num_blocks_override
    if any(d.num_blocks_override != override for d in plan.device_pools):
        faults.add("num_blocks", "stages disagree on the override")
    fitting = override if override is not None else min(
        d.available_bytes // d.bytes_per_block for d in plan.device_pools)
    if plan.num_blocks != fitting:
        faults.add("num_blocks", f"{plan.num_blocks}, the stages give {fitting}")
    for stage, device in enumerate(plan.device_pools):
        if device.size != device.bytes_per_block * plan.num_blocks:
            faults.add("device pool size", f"stage {stage}: {device.size}, expected "
                       f"{device.bytes_per_block} x {plan.num_blocks}")
    source = next((g for g in plan.groups if g.role == "hisparse_source"), None)
    _host(plan, source, faults)
    _hisparse(plan, specs, source, faults)
    if faults:
        return
    _admission_and_capacity(plan, source, faults)


def _host(plan: KVCachePlan, source: KVCacheGroup | None, faults: Faults) -> None:
    host = plan.host_pool
    if host is None or source is None:
        return
    page = source.spec.page_size_bytes
    stride = round_up(page, SHARED_HOST_ALIGN) if host.shared else page
    wants = {"bytes_per_block": (host.bytes_per_block, page),
             "block_stride": (host.block_stride, stride),
             "num_blocks": (host.num_blocks, host.budget_bytes // stride),
             "size": (host.size, host.bytes_per_block * host.num_blocks)}
    for what, (got, want) in wants.items():
        if got != want:
            faults.add(f"host_pool {what}", f"{got}, expected {want}")
    need = ceil_div(plan.max_model_len, source.spec.block_size) + HOST_SPARE_BLOCKS
    if host.num_blocks < need:
        faults.add("host_pool num_blocks", f"{host.num_blocks} < {need} for one request")


def _hisparse(plan: KVCachePlan, specs: dict[str, tuple[int, Spec]],
              source: KVCacheGroup | None, faults: Faults) -> None:
    workload = plan.workload
    derived = {n: s for n, (_, s) in specs.items()
               if isinstance(s, HisparseResidentSpec | HisparseHotSpec)}
    if source is None:
        if derived:
            faults.add("hisparse groups", "resident or hot layers without a source group")
        return
    widths = [s.topk_buffer_width or workload.index_topk for n in source.layer_names
              if isinstance(s := specs[n][1], MLASpec)]
    if None in widths or not widths:
        faults.add("hisparse top_k", "no index_topk for a source layer")
        return
    top_k = max(w for w in widths if w is not None)
    q = workload.max_decode_query_len or 0
    rows = workload.device_buffer_size or 0
    if workload.top_k != top_k:
        faults.add("hisparse top_k", f"{workload.top_k}, the source layers give {top_k}")
    if not q * top_k <= rows <= HOT_ROWS_LIMIT:
        faults.add("hisparse device_buffer_size", f"{rows} outside [{q} x {top_k}, 32768]")
    for name in source.layer_names:
        for suffix in (".hisparse_resident", ".hisparse_hot"):
            if name + suffix not in derived:
                faults.add("hisparse groups", f"{name!r} has no {suffix} layer")
    page_of_source = {n: getattr(specs[n][1], "page_size_bytes", None)
                      for n in source.layer_names}
    for name, spec in derived.items():
        base = name.rsplit(".", 1)[0]
        if page_of_source.get(base) != spec.page_size_bytes:
            faults.add("hisparse page", f"{name!r} page {spec.page_size_bytes}, source "
                       f"{page_of_source.get(base)}")
        if spec.block_size != source.spec.block_size:
            faults.add("hisparse block size", f"{name!r}")
        if isinstance(spec, HisparseHotSpec) and spec.blocks_per_request != ceil_div(
                rows, spec.block_size):
            faults.add("hisparse hot blocks", f"{name!r}: {spec.blocks_per_request}, expected "
                       f"ceil({rows} / {spec.block_size})")


def _admission_and_capacity(plan: KVCachePlan, source: KVCacheGroup | None,
                            faults: Faults) -> None:
    workload = plan.workload
    device = [g for g in plan.groups if not g.host_resident]
    host = plan.host_pool

    def fits(length: int) -> bool:
        blocks = sum(required(g.spec, length, workload) for g in device)
        held = host is None or source is None or host.num_blocks >= ceil_div(
            length, source.spec.block_size) + HOST_SPARE_BLOCKS
        return blocks <= plan.num_blocks - 1 and held

    length = plan.max_model_len
    if not fits(length):
        faults.add("admission", f"a {length}-token request does not fit {plan.num_blocks} "
                   "blocks beside the null block (or the host pool)")
    fitted = plan.fitted_max_model_len
    if fitted is not None and (fitted > workload.max_model_len or (
            fitted < workload.max_model_len and fits(fitted + 1))):
        faults.add("fitted_max_model_len", f"{fitted} is not the longest length up to "
                   f"{workload.max_model_len} that fits")
    needs = [required(g.spec, length, workload) for g in device]
    admission = sum(needs)
    most = plan.num_blocks / admission
    steady: float | None = None
    if source is not None and host is not None:
        host_bound = host.num_blocks / required(source.spec, length, workload)
        kept = sum(min(n, RESIDENT_TAIL_PAGES) if isinstance(g.spec, HisparseResidentSpec)
                   else n for g, n in zip(device, needs, strict=True))
        if plan.num_blocks < admission:
            gpu = plan.num_blocks / admission
        else:
            gpu = 1 + (plan.num_blocks - admission) / kept
        most = min(most, host_bound)
        steady = min(gpu, host_bound)
    capacity = plan.capacity
    if not near(capacity.max_concurrency, most):
        faults.add("capacity", f"max_concurrency {capacity.max_concurrency}, the groups give "
                   f"{most}")
    got = capacity.steady_state_concurrency
    if (got is None) != (steady is None) or (
            got is not None and steady is not None and not near(got, steady)):
        faults.add("capacity", f"steady_state_concurrency {got}, the groups give {steady}")
