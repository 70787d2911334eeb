"""Plans for transfer tests, and the oracle: fill a side's pages through the plan's own views
(vLLM's per-layer views, SGLang's buffer views) with bytes that encode (layer, unit, global
head, row byte), and the bytes a destination must hold afterwards. Its arithmetic is its own:
numpy index grids over the views, none of the transfer package's places, walks or rows."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from math import prod
from typing import Any

import numpy as np
from numpy.typing import NDArray

import hisparse_plan as hp
from hisparse_plan.exchange.transfer import Instance, TransferRequest
from hisparse_plan.models import DTYPE_SIZE, KVLayerSpec, MambaSpec, MLASpec
from hisparse_plan.models.any_plan import Plan
from hisparse_plan.models.pools import BUFFER_DTYPE_SIZE
from hisparse_plan.models.sglang_plan import SGLangPlan
from hisparse_plan.views import plan_views, spec_of

Buffers = dict[tuple[int, str], NDArray[np.uint8]]
SGLANG_TABLES = {"kv": "full", "kv_v": "full", "index": "full", "swa": "swa",
                 "hisparse_host": "hisparse_host"}


# ---- plans ---------------------------------------------------------------------------------

def vllm_request(layers: dict[str, dict[str, Any]], *, layout: str = "BLNHC",
                 available: int = 2**24, max_model_len: int = 1024,
                 hisparse: dict[str, Any] | None = None, index_topk: int | None = None,
                 **scheduler: Any) -> dict[str, Any]:
    model: dict[str, Any] = {"max_model_len": max_model_len}
    if index_topk is not None:
        model["index_topk"] = index_topk
    return {
        "layers": layers, "model": model, "hisparse": hisparse,
        "device": {"available_bytes": available, "kv_cache_layout": layout,
                   "num_blocks_override": None},
        "scheduler": {"max_num_batched_tokens": max_model_len, "max_concurrent_batches": 1,
                      **scheduler},
    }


def sglang_request(layers: dict[str, dict[str, Any]], *, page_size: int, tokens: int,
                   context_length: int = 1024, available: int = 2**26,
                   **engine: Any) -> dict[str, Any]:
    request = vllm_request(layers, available=available, max_model_len=context_length)
    request["engine"] = {"name": "sglang", "page_size": page_size,
                         "context_length": context_length, "max_total_tokens": tokens,
                         "max_running_requests": 4, **engine}
    return request


def plan_of(request: dict[str, Any]) -> Plan:
    return hp.plan_for_engine(request)


# ---- the oracle ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Cells:
    """One block of one layer on one rank: byte addresses of a region, and what each holds."""

    region: str
    table: str
    kind: str
    """tokens, pages or state."""
    units: int
    """Units one block holds."""
    tokens: int
    """Tokens one unit stands for (a page's for index keys; 0 for a state)."""
    addresses: NDArray[np.int64]
    unit: NDArray[np.int64]
    """Unit within the block."""
    head: NDArray[np.int64]
    """Global head."""
    byte: NDArray[np.int64]
    """Byte of the logical row."""


def encode(layer: int, unit: NDArray[np.int64], head: NDArray[np.int64],
           byte: NDArray[np.int64]) -> NDArray[np.uint8]:
    """A byte that changes with every coordinate (mixed, so a misplaced byte shows)."""
    with np.errstate(over="ignore"):
        mixed: NDArray[np.uint8] = _mix(layer, unit, head, byte)
    return mixed


def _mix(layer: int, unit: NDArray[np.int64], head: NDArray[np.int64],
         byte: NDArray[np.int64]) -> NDArray[np.uint8]:
    x = (np.uint64(layer + 1) * np.uint64(0x9E3779B97F4A7C15)
         + unit.astype(np.uint64) * np.uint64(0xBF58476D1CE4E5B9)
         + head.astype(np.uint64) * np.uint64(0x94D049BB133111EB)
         + byte.astype(np.uint64) * np.uint64(0x2545F4914F6CDD1D))
    x ^= x >> np.uint64(29)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(32)
    low: NDArray[np.uint8] = (x & np.uint64(0xFF)).astype(np.uint8)
    return low


def _grid(*extents: int) -> list[NDArray[np.int64]]:
    return [axis.astype(np.int64).ravel() for axis in np.indices(extents)]


StateCuts = dict[int, tuple[int, tuple[int, ...]] | None]
"""How a test drew a layer's states: state index -> (its sharded axis, the full extents of
the blocks along it), or None for a state the same on every rank. Given, the oracle encodes
a state's bytes by their place in the full state (the state of TP 1), so that ranks of two
TP sizes agree on them."""


def full_state_bytes(shape: tuple[int, ...], size: int, rank: int, ranks: int,
                     cut: tuple[int, tuple[int, ...]] | None) -> tuple[NDArray[np.int64], int]:
    """For each byte of one rank's state (C order), its byte in the full state; and the
    full state's bytes. Each block along the axis is split evenly over the ranks."""
    if cut is None:
        return np.arange(prod(shape) * size, dtype=np.int64), prod(shape) * size
    axis, blocks = cut
    index = np.indices(shape).reshape(len(shape), -1)
    shares = np.array([block // ranks for block in blocks])
    mine = np.concatenate([[0], np.cumsum(shares)[:-1]])
    theirs = np.concatenate([[0], np.cumsum(blocks)[:-1]])
    channel = index[axis]
    block = np.searchsorted(mine, channel, side="right") - 1
    index[axis] = theirs[block] + rank * shares[block] + channel - mine[block]
    full = list(shape)
    full[axis] = sum(blocks)
    flat: NDArray[np.int64] = np.asarray(np.ravel_multi_index(tuple(index), full))
    return (flat[:, None] * size + np.arange(size)).ravel().astype(np.int64), prod(full) * size


def head_origin(heads: int, rank: int, ranks: int, total: int | None) -> int:
    total = heads * ranks if total is None else total
    return rank * heads if total >= ranks else rank // (ranks // total)


def vllm_cells(plan: hp.KVCachePlan, rank: int, ranks: int, total: int | None,
               states: StateCuts | None = None) -> Iterator[tuple[str, Any]]:
    """(layer, cells(block)) for every transferred layer of a vLLM plan."""
    specs = spec_of(plan)
    for view in plan_views(plan, specs).values():
        group = plan.groups[view.group]
        spec = specs[view.name][1]
        if not group.enable_kv_transfer or group.spec.kind in ("hisparse_resident",
                                                               "hisparse_hot"):
            continue
        region = plan.tensors[view.tensor].pool
        table = f"group.{view.group}"

        def cells(block: int, view: Any = view, spec: Any = spec, region: str = region,
                  table: str = table) -> list[Cells]:
            start = view.offset + block * view.strides[0]
            if isinstance(spec, MambaSpec):
                addresses, bytes_ = [], []
                at = lo = 0
                for index, (shape, dtype) in enumerate(zip(spec.state_shapes,
                                                           spec.state_dtypes, strict=True)):
                    size = prod(shape) * DTYPE_SIZE[dtype]
                    addresses.append(start + at + np.arange(size))
                    if states is None:
                        bytes_.append(lo + np.arange(size))
                        lo += size
                    else:
                        full, whole = full_state_bytes(tuple(shape), DTYPE_SIZE[dtype], rank,
                                                       ranks, states[index])
                        bytes_.append(lo + full)
                        lo += whole
                    at += -(-size // spec.state_alignment) * spec.state_alignment
                found = np.concatenate(bytes_)
                zero = np.zeros(found.size, dtype=np.int64)
                return [Cells(region, table, "state", 1, 0, np.concatenate(addresses), zero,
                              zero + (rank if states is None else 0), found)]
            _, heads, units, elements = view.shape
            _, head_stride, unit_stride, size = view.strides
            h, n, c = _grid(heads, units, elements * size)
            addresses = start + h * head_stride + n * unit_stride + c
            if isinstance(spec, MLASpec) and spec.cache_role == "indexer":
                zero = np.zeros_like(c)
                return [Cells(region, table, "pages", 1, units, addresses, zero, zero,
                              n * elements * size + c)]
            origin = 0 if not isinstance(spec, KVLayerSpec) else head_origin(
                heads, rank, ranks, total)
            return [Cells(region, table, "tokens", units, 1, addresses, n, h + origin, c)]

        yield view.name, cells


def sglang_cells(plan: SGLangPlan, rank: int, ranks: int, total: int | None,
                 states: StateCuts | None = None) -> Iterator[tuple[str, Any]]:
    """(layer, cells(block)) for every moved layer of an SGLang plan."""
    pools = {pool.name: pool for pool in plan.pools}
    hosted = {name for t in plan.tensors if t.pool == "hisparse_host" for name in t.layers}
    found: dict[str, list[Any]] = {}
    for tensor in plan.tensors:
        pool = pools[tensor.pool]
        if plan.hisparse is not None and pool.name == "kv" and set(tensor.layers) <= hosted:
            continue
        table = "mamba" if pool.name.startswith("mamba") else SGLANG_TABLES[pool.name]
        page = pool.block_tokens or 1
        for view in tensor.views:
            size = BUFFER_DTYPE_SIZE[view.dtype]
            for position, name in enumerate(tensor.layers):
                region = pool.name if pool.allocation == "whole" else f"{pool.name}/{name}"
                found.setdefault(name, []).append(
                    (view, size, position if pool.allocation == "whole" else None, region,
                     table, page))
    for name, parts in found.items():
        parts.sort(key=lambda part: (part[0].name == "v_buffer", part[0].name == "temporal",
                                     part[0].name))

        def cells(block: int, parts: list[Any] = parts) -> list[Cells]:
            out: list[Cells] = []
            lo = state = 0
            for view, size, layer, region, table, page in parts:
                shape, strides = list(view.shape), list(view.strides)
                if layer is not None:
                    offset = view.storage_offset + layer * strides[0]
                    shape, strides = shape[1:], strides[1:]
                else:
                    offset = view.storage_offset
                if view.name in ("index_k",) or table == "mamba":
                    index = _grid(*shape[1:])
                    element = offset + block * strides[0] + sum(
                        i * s for i, s in zip(index, strides[1:], strict=True))
                    flat = np.ravel_multi_index(index, shape[1:]) if index else np.zeros(1)
                    e = np.arange(size)
                    addresses = (element[:, None] * size + e).ravel()
                    byte = lo + (flat[:, None] * size + e).ravel()
                    whole = prod(shape[1:]) * size
                    kind = "state" if table == "mamba" else "pages"
                    if kind == "state" and states is not None:
                        full, whole = full_state_bytes(tuple(shape[1:]), size, rank, ranks,
                                                       states[state])
                        byte = lo + full
                    zero = np.zeros_like(byte)
                    head = rank if kind == "state" and states is None else 0
                    out.append(Cells(region, table, kind, 1, 0 if kind == "state" else page,
                                     addresses, zero, zero + head, byte))
                    lo += whole
                    state += kind == "state"
                    continue
                _, heads, elements = shape
                n, h, d, e = _grid(page, heads, elements, size)
                element = offset + (block * page + n) * strides[0] + h * strides[1] \
                    + d * strides[2]
                origin = 0 if view.name in ("kv_buffer", "host_kv_buffer") else head_origin(
                    heads, rank, ranks, total)
                out.append(Cells(region, table, "tokens", page, 1, element * size + e, n,
                                 h + origin, lo + d * size + e))
                lo += elements * size
            return out

        yield name, cells


def rank_cells(plan: Plan, rank: int, ranks: int, total: int | None,
               states: StateCuts | None = None) -> Iterator[tuple[str, Any]]:
    if isinstance(plan, SGLangPlan):
        return sglang_cells(plan, rank, ranks, total, states)
    return vllm_cells(plan, rank, ranks, total, states)


def write(instance: Instance, blocks: dict[str, list[int]], buffers: Buffers,
          layer_ids: dict[str, int], units: dict[str, tuple[int, int]],
          states: StateCuts | None = None) -> None:
    """Write every layer's bytes for units [first, stop) (per layer) through the plans' own
    views, at the request's blocks."""
    for index, (plan, (rank, ranks)) in enumerate(zip(instance.plans, stage_ranks(instance),
                                                      strict=True)):
        for name, cells_of in rank_cells(plan, rank, ranks, instance.total_kv_heads, states):
            if name not in units:
                continue
            first, stop = units[name]
            probe = cells_of(0)[0]
            ids = blocks[probe.table]
            positions = [len(ids) - 1] if probe.kind == "state" else range(len(ids))
            for position in positions:
                for cells in cells_of(ids[position]):
                    unit = (0 if cells.kind == "state" else position * cells.units) + cells.unit
                    keep = (unit >= first) & (unit < stop)
                    value = encode(layer_ids[name], unit, cells.head, cells.byte)
                    buffers[(index, cells.region)][cells.addresses[keep]] = value[keep]


def stage_ranks(instance: Instance) -> list[tuple[int, int]]:
    """Each plan's (place among the plans that hold its layers, how many do): its
    tensor-parallel rank and size within its pipeline stage (SGLang's pipeline ranks each
    plan their own layers)."""
    held = [frozenset(name for name, _ in rank_cells(plan, 0, 1, None))
            for plan in instance.plans]
    return [(held[:rank].count(names), held.count(names)) for rank, names in enumerate(held)]


def layer_shapes(instance: Instance) -> dict[str, Cells]:
    """Each layer's first cells on the first rank that holds it (its kind, table and units
    per block)."""
    found: dict[str, Cells] = {}
    for plan in instance.plans:
        for name, cells_of in rank_cells(plan, 0, instance.ranks, None):
            if name not in found:
                found[name] = cells_of(1)[0]
    return found


def units_needed(name: str, src: Cells, dst: Cells, request: TransferRequest, first: int,
                 reach: int | None = None) -> tuple[tuple[int, int], tuple[int, int]]:
    """(what the destination must get, what it may get): units [first, T) for rows, the
    request's pages, one state; up to what both sides' blocks hold, from `reach` (default
    `first`: a pattern may start a window at a block start before it)."""
    tokens = request.num_tokens
    if src.kind == "state":
        return (0, 1), (0, 1)
    if src.kind == "pages":
        pages = -(-tokens // src.tokens)
        return (0, pages), (0, pages)
    held = min(len(request.source_blocks[src.table]) * src.units,
               len(request.destination_blocks[dst.table]) * dst.units)
    return (first, tokens), (first if reach is None else reach, held)


def roundtrip(src: Instance, dst: Instance, request: TransferRequest,
              firsts: dict[str, int] | None = None, states: StateCuts | None = None
              ) -> tuple[Any, int]:
    """Build, prove and run the program; fill the source through its views, read the
    destination back through its own: returns (program, bytes that differ)."""
    from hisparse_plan.exchange.transfer import build_transfer, check_transfer

    program = build_transfer(src, dst, request)
    check_transfer(program, src, dst)
    return program, count_wrong(src, dst, request, program, firsts, states=states)


def count_wrong(src: Instance, dst: Instance, request: TransferRequest, program: Any,
                firsts: dict[str, int] | None = None, reach: dict[str, int] | None = None,
                states: StateCuts | None = None) -> int:
    """Run `program` with the reference executor over buffers filled through the source's
    views; count the destination bytes that are neither what its views place there nor (past
    the request's last token, in its own blocks) the source's bytes for them."""
    from hisparse_plan.exchange.transfer.executors.reference import execute

    source, destination, expected, allowed = oracle(src, dst, request, program, firsts, reach,
                                                    states)
    execute(program, source, destination)
    return wrong_bytes(destination, expected, allowed)


def oracle(src: Instance, dst: Instance, request: TransferRequest, program: Any,
           firsts: dict[str, int] | None = None, reach: dict[str, int] | None = None,
           states: StateCuts | None = None) -> tuple[Buffers, Buffers, Buffers, Buffers]:
    """(source filled through its views, destination as it starts (random, seed 2), what
    the destination must hold after, what it may hold after)."""
    from hisparse_plan.exchange.transfer.executors.reference import buffers

    ours, theirs = layer_shapes(src), layer_shapes(dst)
    ids = {name: index for index, name in enumerate(sorted(theirs))}
    need, may = {}, {}
    for name in theirs:
        need[name], may[name] = units_needed(name, ours[name], theirs[name], request,
                                             (firsts or {}).get(name, 0),
                                             (reach or {}).get(name))
    source = buffers(program.source, fill=None, seed=1)
    write(src, dict(request.source_blocks), source, ids,
          {name: (0, 2**40) for name in theirs}, states)
    destination = buffers(program.destination, fill=None, seed=2)
    expected = {key: value.copy() for key, value in destination.items()}
    write(dst, dict(request.destination_blocks), expected, ids, need, states)
    allowed = {key: value.copy() for key, value in expected.items()}
    write(dst, dict(request.destination_blocks), allowed, ids, may, states)
    return source, destination, expected, allowed


def wrong_bytes(destination: Buffers, expected: Buffers, allowed: Buffers) -> int:
    return sum(int(np.count_nonzero((destination[key] != expected[key])
                                    & (destination[key] != allowed[key])))
               for key in destination)


# ---- small plans ---------------------------------------------------------------------------

def attention_layers(count: int, heads: int, *, head_size: int = 16, dtype: str = "bfloat16",
                     block: int = 16, window: int | None = None, head_size_v: int | None = None,
                     first: int = 0) -> dict[str, dict[str, Any]]:
    """`count` attention layers of one rank (`heads` KV heads each)."""
    spec: dict[str, Any] = {"kind": "full_attention" if window is None else "sliding_window",
                            "block_size": block, "num_kv_heads": heads,
                            "head_size": head_size, "dtype": dtype}
    if window is not None:
        spec["sliding_window"] = window
    if head_size_v is not None:
        spec["head_size_v"] = head_size_v
    return {f"model.layers.{first + i}.self_attn.attn": dict(spec) for i in range(count)}


def vllm_plan(layers: dict[str, dict[str, Any]], *, layout: str = "BLNHC", blocks: int = 24,
              max_model_len: int = 256, **extra: Any) -> hp.KVCachePlan:
    request = vllm_request(layers, layout=layout, available=2**40,
                           max_model_len=max_model_len, **extra)
    request["device"]["num_blocks_override"] = blocks
    plan = hp.plan_for_engine(request)
    assert isinstance(plan, hp.KVCachePlan)
    return plan


def sglang_plan(layers: dict[str, dict[str, Any]], *, page: int, tokens: int = 512,
                context_length: int = 256, **engine: Any) -> SGLangPlan:
    plan = hp.plan_for_engine(sglang_request(layers, page_size=page, tokens=tokens,
                                             context_length=context_length, **engine))
    assert isinstance(plan, SGLangPlan)
    return plan


def request_blocks(instance: Instance, num_tokens: int, seed: int, *, runs: bool = False,
                   spare: int = 0, packed: bool = False) -> dict[str, list[int]]:
    """Block ids for every table of the instance's rank-0 plan: distinct over tables that
    share a pool; shuffled, (`runs`) a few runs of consecutive ids, or (`packed`) the lowest
    free ids in order, so that tables sharing a pool hold runs that touch."""
    from hisparse_plan.exchange.transfer import tables

    rng = np.random.default_rng(seed)
    taken: set[tuple[int, int]] = set()
    found: dict[str, list[int]] = {}
    for key, table in tables(instance.plans[0]).items():
        count = 2 if table.state else -(-num_tokens // table.block_tokens) + spare
        pool = table.num_blocks
        free = [b for b in range(table.padding_blocks, table.num_blocks)
                if (pool, b) not in taken]
        if packed:
            chosen = free[:count]
        elif runs:
            start = int(rng.integers(0, max(1, len(free) - count)))
            chosen = free[start:start + count]
            if len(chosen) > 2:
                cut = int(rng.integers(1, len(chosen)))
                chosen = chosen[cut:] + chosen[:cut]
        else:
            chosen = [free[i] for i in rng.permutation(len(free))[:count]]
        if len(chosen) < count:
            raise ValueError(f"table {key}: {len(free)} free blocks, {count} needed")
        taken.update((pool, b) for b in chosen)
        found[key] = [int(b) for b in chosen]
    return found


def deepseek_plan(*, hisparse: bool = False, engine: str = "vllm", layers: int = 2,
                  layout: str = "BLNHC", block: int = 64, kv_dtype: str = "fp8_ds_mla",
                  blocks: int = 24, hisparse_bytes: tuple[int, int] = (2**24, 2**25),
                  host_layout: str = "layer_outermost") -> Plan:
    """The plan of `deepseek_request` (its arguments)."""
    return plan_of(deepseek_request(hisparse=hisparse, engine=engine, layers=layers,
                                    layout=layout, block=block, kv_dtype=kv_dtype,
                                    blocks=blocks, hisparse_bytes=hisparse_bytes,
                                    host_layout=host_layout))


def deepseek_request(*, hisparse: bool = False, engine: str = "vllm", layers: int = 2,
                     layout: str = "BLNHC", block: int = 64, kv_dtype: str = "fp8_ds_mla",
                     blocks: int = 24, hisparse_bytes: tuple[int, int] = (2**24, 2**25),
                     host_layout: str = "layer_outermost") -> dict[str, Any]:
    """DeepSeek-V3.2's first `layers` decoder layers (latent rows and index keys), small:
    vLLM with or without HiSparse, or SGLang (fp8 rows: 656 bytes, as vLLM's fp8_ds_mla).
    `hisparse_bytes`: a vLLM HiSparse plan's host pool and device bytes; `host_layout` its
    hisparse.host_pool_layout."""
    from hisparse_plan.models import KVCacheLayout
    from hisparse_plan.presets import Settings, build_request, load_preset

    settings = Settings(max_model_len=1024, layout=KVCacheLayout(layout), block_size=block,
                        kv_dtype=kv_dtype,  # type: ignore[arg-type]
                        hisparse=hisparse,
                        host_pool_bytes=hisparse_bytes[0] if hisparse and engine == "vllm"
                        else None)
    request = build_request(load_preset("deepseek-v3.2").architecture, settings)
    data = request.model_dump(mode="json")
    keep = tuple(f"model.layers.{i}." for i in range(layers))
    data["layers"] = {name: spec for name, spec in data["layers"].items()
                      if name.startswith(keep)}
    if engine == "sglang":
        data["hisparse"] = None
        data["model"].pop("index_topk", None)
        data["engine"] = {
            "name": "sglang", "page_size": block, "context_length": 1024,
            "max_total_tokens": 2048, "max_running_requests": 4,
            "kv_cache_dtype": "fp8_e4m3" if kv_dtype == "fp8_ds_mla" else "bfloat16",
            "enable_hisparse": hisparse, "hisparse_top_k": 64,
            "hisparse_device_buffer_size": 128,
        }
        data["device"]["available_bytes"] = 2**28
        return data
    data["device"]["num_blocks_override"] = blocks if not hisparse else None
    data["device"]["available_bytes"] = 2**40 if not hisparse else hisparse_bytes[1]
    if hisparse:
        data["hisparse"]["host_pool_layout"] = host_layout
    return data


def sglang_stages(pp: int, tp: int, *, layers: int = 4, heads: int = 4, page: int = 16
                  ) -> Instance:
    """An SGLang instance of `pp` pipeline ranks of `tp` TP ranks each: plans in rank order,
    each pipeline rank's TP ranks together (a pipeline rank plans its own layers)."""
    specs = attention_layers(layers, max(1, heads // tp), block=page)
    plans = []
    for rank in range(pp):
        extra = {"pp_size": pp, "pp_rank": rank} if pp > 1 else {}
        plans += [plan_of(sglang_request(specs, page_size=page, tokens=512, context_length=512,
                                         available=2**30, **extra))] * tp
    return Instance(plans, total_kv_heads=heads)


def vllm_stages(pp: int, tp: int, *, layers: int = 4, heads: int = 4, block: int = 16,
                layout: str = "BLHNC") -> Instance:
    """A vLLM instance of `tp` ranks: each rank's plan holds every pipeline stage (layers
    split evenly, earlier stages one more), a device pool each."""
    specs = attention_layers(layers, max(1, heads // tp), block=block)
    request = vllm_request(specs, layout=layout, max_model_len=512)
    names = list(specs)
    cuts = [layers * stage // pp for stage in range(pp + 1)]
    request["device"]["pipeline_stages"] = [
        {"layers": names[cuts[stage]:cuts[stage + 1]], "available_bytes": 2**20}
        for stage in range(pp)]
    return Instance([plan_of(request)] * tp, total_kv_heads=heads)

