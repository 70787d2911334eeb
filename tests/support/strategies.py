"""Hypothesis strategies for plan requests, as JSON-shaped dicts.

`hisparse_requests` covers the space SPEC 5 plans over: layer counts, leader patterns, indexer
placement, row widths, dtypes, block sizes, top-k, decode width, hot buffer sizes, host pools
near their minimum, shared pools, layouts, overrides and extra regular layers. Most requests
plan; some are refused on purpose (a pool one block short, mixed block sizes), and the tests
accept a `PlanError` for those.
"""

from __future__ import annotations

import math
from itertools import pairwise
from typing import Any

from hypothesis import strategies as st

from hisparse_plan.models import DTYPE_SIZE, KVCacheLayout

DTYPES = sorted(DTYPE_SIZE)
USUAL_LAYOUTS = ["BLNHC", "BLHNC"]
LAYOUTS = [layout.value for layout in KVCacheLayout]
GIB = 2**30


def rarely(draw: st.DrawFn, one_in: int) -> bool:
    """True about once in `one_in` draws (not at the edge hypothesis favours)."""
    return draw(st.integers(0, one_in - 1)) == one_in // 2


@st.composite
def mla_spec(
    draw: st.DrawFn, *, role: str, block_size: int, small: bool, leader: bool = False
) -> dict[str, Any]:
    dtype = draw(st.sampled_from(DTYPES))
    head_size = draw(st.integers(1, 64 if small else 1024))
    spec: dict[str, Any] = {
        "kind": "mla",
        "block_size": block_size,
        "head_size": head_size,
        "dtype": dtype,
        "cache_role": role,
    }
    if role == "sparse":
        spec["is_index_group_leader"] = leader
        if draw(st.booleans()):
            rows = draw(st.integers(1, 96 if small else 1024))
            spec["state_content_bytes"] = rows * DTYPE_SIZE[dtype]
        if rarely(draw, 10):
            spec["topk_buffer_width"] = draw(st.integers(1, 4096))
    if rarely(draw, 10):
        spec["num_kv_heads"] = draw(st.integers(1, 4))
    return spec


@st.composite
def regular_specs(draw: st.DrawFn, *, small: bool, refusals: bool) -> list[dict[str, Any]]:
    """0-4 full-attention or sliding-window layers: one spec, a uniform_type mix, or hybrid."""
    count = draw(st.integers(0, 4))
    kind = draw(st.sampled_from(["full_attention", "sliding_window"]))
    block_size = draw(st.sampled_from([1, 16, 64]))
    specs = []
    for _ in range(count):
        spec: dict[str, Any] = {
            "kind": kind,
            "block_size": block_size,
            "num_kv_heads": draw(st.integers(1, 4)),
            "head_size": draw(st.integers(1, 32 if small else 256)),
            "dtype": draw(st.sampled_from(DTYPES)),
        }
        if kind == "sliding_window":
            spec["sliding_window"] = draw(st.integers(1, 8192))
        specs.append(spec)
    if specs and refusals and rarely(draw, 6):
        specs[-1] = {**specs[-1], "block_size": block_size * 2}  # hybrid: refused for now
    if len(specs) > 1 and draw(st.booleans()):
        specs = [specs[0]] * len(specs)  # one shared spec
    return specs


def _leaders(draw: st.DrawFn, count: int, *, allow_none: bool) -> list[bool]:
    patterns = ["all", "every", "random", "none"] if allow_none else ["all", "every", "random"]
    pattern = draw(st.sampled_from(patterns))
    if pattern == "all":
        return [True] * count
    if pattern == "none":
        return [False] * count
    if pattern == "every":
        step = draw(st.integers(1, 8))
        return [i % step == 0 for i in range(count)]
    return draw(st.lists(st.booleans(), min_size=count, max_size=count))


@st.composite
def hisparse_requests(
    draw: st.DrawFn, *, max_layers: int = 200, small: bool = False, refusals: bool = True
) -> dict[str, Any]:
    """A HiSparse request. `small` keeps both pools to a few MiB, for real allocations;
    `refusals=False` leaves out what is refused on purpose, so nearly every request plans."""
    count = draw(st.integers(1, max_layers))
    block_size = draw(st.sampled_from([1, 2, 16, 64] if small else [1, 16, 32, 64, 128]))
    indexers_on = draw(st.sampled_from(["every", "leaders"]))
    leaders = _leaders(draw, count, allow_none=indexers_on == "every")
    source = draw(mla_spec(role="sparse", block_size=block_size, small=small))
    indexer = draw(mla_spec(role="indexer", block_size=block_size, small=small))
    if rarely(draw, 4):  # indexer rows as wide as source rows: one page size everywhere
        indexer = {**source, "cache_role": "indexer", "is_index_group_leader": False}
    varieties = ["one spec", "same page", "any"] if refusals else ["one spec", "same page"]
    variety = draw(st.sampled_from(varieties if rarely(draw, 2) else ["one spec"]))
    layers: dict[str, Any] = {}
    for i, leader in enumerate(leaders):
        spec = source
        if variety == "same page" and rarely(draw, 3):
            spec = {**source, "cache_dtype": "variant"}
        elif variety == "any" and rarely(draw, 3):
            spec = draw(mla_spec(role="sparse", block_size=block_size, small=small))
        layers[f"model.layers.{i}.self_attn.attn"] = {**spec, "is_index_group_leader": leader}
        if indexers_on == "every" or leader:
            layers[f"model.layers.{i}.self_attn.indexer.k_cache"] = indexer
    if refusals and rarely(draw, 20):  # mixed MLA block sizes: refused
        name = next(iter(layers))
        layers[name] = {**layers[name], "block_size": block_size * 2}
    for i, spec in enumerate(draw(regular_specs(small=small, refusals=refusals))):
        layers[f"model.extra.{i}.attn"] = spec

    max_model_len = draw(st.integers(1, 64 if small else 262144))
    index_topk = draw(st.integers(1, 16 if small else 4096))
    source_page = sum(
        _page(spec) for spec in layers.values() if spec["kind"] == "mla"
        and spec["cache_role"] == "sparse"
    )
    shared = draw(st.booleans())
    stride = math.ceil(source_page / 4096) * 4096 if shared else source_page
    needed = (math.ceil(max_model_len / block_size) + 2) * stride
    # Near the minimum on both sides: a few blocks short up to a few blocks spare.
    spare_blocks = draw(st.integers(-3 if refusals else 0, 40))
    host_bytes = needed + spare_blocks * stride + draw(st.integers(0, stride - 1))
    host_pool_gib = max(host_bytes, 1) / GIB
    queries = draw(st.integers(1, 2 if small else 4))
    widths = [spec.get("topk_buffer_width") or index_topk for spec in layers.values()
              if spec["kind"] == "mla" and spec["cache_role"] == "sparse"]
    device_buffer: int | None = None
    if draw(st.booleans()):  # around the minimum, sometimes below it or past 32768
        slack = draw(st.integers(-2 if refusals else 0, 300))
        device_buffer = max(1, queries * max(widths) + slack)
    scheduler = {
        "max_num_batched_tokens": draw(st.integers(1, 16384)),
        "max_concurrent_batches": draw(st.integers(1, 4)),
    }
    available = draw(_device_bytes())
    override = draw(st.integers(1, 10**6)) if not small and draw(st.booleans()) else None
    if small:
        # Pools of a few blocks: enough for one request (an upper bound on SPEC 5.12's need),
        # or with refusals now and then a block or two short.
        rows = device_buffer if device_buffer is not None else (queries + 1) * max(widths)
        enough = _blocks_upper_bound(layers, max_model_len, block_size, rows, scheduler)
        short = refusals and rarely(draw, 8)
        override = max(1, enough + 1 - (draw(st.integers(1, enough)) if short else 0)
                       + draw(st.integers(0, 4)))
    return {
        "layers": layers,
        "model": {"max_model_len": max_model_len, "index_topk": index_topk},
        "hisparse": {
            "host_pool_gib": host_pool_gib,
            "device_buffer_size": device_buffer,
            "max_decode_query_len": queries,
            "shared_host_pool": shared,
        },
        "device": {
            "available_bytes": available,
            "kv_cache_layout": draw(st.sampled_from(LAYOUTS if refusals and rarely(draw, 4)
                                                     else USUAL_LAYOUTS)),
            "num_blocks_override": override,
        },
        "scheduler": scheduler,
    }


def _blocks_upper_bound(
    layers: dict[str, Any], length: int, block_size: int, rows: int, scheduler: dict[str, int]
) -> int:
    """At least the device blocks one request takes (SPEC 5.10): every source layer counted
    as a pack of its own, every other layer as a group of its own."""
    sources = sum(1 for s in layers.values() if s["kind"] == "mla" and s["cache_role"] == "sparse")
    others = sum(1 for s in layers.values() if s["kind"] != "mla")
    blocks = math.ceil(length / block_size)
    inflight = scheduler["max_num_batched_tokens"] * scheduler["max_concurrent_batches"]
    resident = math.ceil(min(inflight, length) / block_size)
    hot = math.ceil(rows / block_size)
    return blocks + sources * (resident + hot) + others * (length + 1)  # block size >= 1


def _page(spec: dict[str, Any]) -> int:
    size = DTYPE_SIZE[spec.get("dtype", "bfloat16")]
    content = spec.get("state_content_bytes") or spec["head_size"] * size
    return int(spec.get("num_kv_heads", 1) * spec["block_size"] * content)


# -- regular and hybrid requests (SPEC 4.1, 7) ------------------------------------------------

REGULAR_KINDS = ["full_attention", "sliding_window", "chunked_local_attention", "mla",
                 "sliding_window_mla", "mamba", "cross_attention"]


@st.composite
def any_layer_spec(draw: st.DrawFn, *, block_size: int, kinds: list[str]) -> dict[str, Any]:
    """One layer of any kind of SPEC 4.1, with the optional fields now and then."""
    kind = draw(st.sampled_from(kinds))
    spec: dict[str, Any] = {"kind": kind, "block_size": block_size}
    if kind == "mamba":
        count = draw(st.integers(1, 2))
        spec["state_shapes"] = [
            draw(st.lists(st.integers(1, 64), min_size=1, max_size=3)) for _ in range(count)
        ]
        spec["state_dtypes"] = [draw(st.sampled_from(DTYPES)) for _ in range(count)]
        if rarely(draw, 3):
            natural = sum(math.prod(shape) * DTYPE_SIZE[dtype] for shape, dtype in zip(
                spec["state_shapes"], spec["state_dtypes"], strict=True))
            spec["page_size_padded"] = max(1, natural + draw(st.integers(-2, 4096)))
        if rarely(draw, 3):
            spec["num_speculative_blocks"] = draw(st.integers(0, 3))
    else:
        spec["head_size"] = draw(st.integers(1, 256))
        spec["dtype"] = draw(st.sampled_from(DTYPES))
        spec["num_kv_heads"] = draw(st.integers(1, 8))
        if kind in ("mla", "sliding_window_mla"):
            if rarely(draw, 4):
                spec["compress_ratio"] = draw(st.sampled_from([2, 4, 128]))
            if rarely(draw, 4):
                spec["alignment"] = draw(st.sampled_from([64, 576, 4096]))
            if rarely(draw, 4):
                spec["state_content_bytes"] = DTYPE_SIZE[spec["dtype"]] * draw(
                    st.integers(1, 700))
        elif rarely(draw, 4):
            spec["head_size_v"] = draw(st.integers(1, 256))
        if kind in ("sliding_window", "sliding_window_mla"):
            spec["sliding_window"] = draw(st.sampled_from([1, 128, 1024, 4096]))
        if kind == "chunked_local_attention":
            spec["attention_chunk_size"] = draw(st.sampled_from([64, 2048, 8192]))
    if rarely(draw, 6):
        spec["block_stride_alignment"] = draw(st.sampled_from([2, 256, 4096]))
    return spec


@st.composite
def layer_pattern(
    draw: st.DrawFn, *, max_layers: int, kinds: list[str], prefix: str
) -> dict[str, Any]:
    """A model-like stack: a palette of 1-4 specs repeated periodically or at random."""
    palette_size = draw(st.integers(1, 4))
    palette = [
        draw(any_layer_spec(block_size=draw(st.sampled_from([1, 16, 16, 32, 64])), kinds=kinds))
        for _ in range(palette_size)
    ]
    count = draw(st.integers(1, max_layers))
    if draw(st.booleans()):
        period = draw(st.lists(st.integers(0, palette_size - 1), min_size=1, max_size=6))
        choices = [period[i % len(period)] for i in range(count)]
    else:
        choices = draw(st.lists(st.integers(0, palette_size - 1), min_size=count,
                                max_size=count))
    return {f"{prefix}.{i}.layer": palette[choice] for i, choice in enumerate(choices)}


def _device_bytes() -> st.SearchStrategy[int]:
    """Mostly enough for a plan, sometimes far too little."""
    return st.sampled_from(["ample", "ample", "ample", "scarce"]).flatmap(
        lambda size: st.integers(2**30, 2**40) if size == "ample" else st.integers(0, 2**26)
    )


@st.composite
def regular_requests(
    draw: st.DrawFn, *, max_layers: int = 60, small: bool = False
) -> dict[str, Any]:
    """A request without HiSparse: any kinds, pages, paddings, layouts, stages, auto-fit.
    `small` keeps pools to a few blocks (for enumeration)."""
    layers = draw(layer_pattern(max_layers=max_layers, kinds=REGULAR_KINDS, prefix="model"))
    max_model_len = draw(st.integers(1, 64)) if small else draw(
        st.one_of(st.integers(1, 4096), st.integers(4096, 262144)))
    device: dict[str, Any] = {
        "available_bytes": draw(_device_bytes()),
        "kv_cache_layout": draw(st.sampled_from(LAYOUTS)),
    }
    if small or rarely(draw, 5):
        device["num_blocks_override"] = draw(st.integers(1, 6 if small else 10**5))
    names = list(layers)
    if len(names) > 1 and rarely(draw, 3):
        cuts = sorted(set(draw(st.lists(st.integers(1, len(names) - 1), min_size=1,
                                        max_size=3))))
        bounds = [0, *cuts, len(names)]
        device["pipeline_stages"] = [
            {"layers": names[a:b],
             "available_bytes": draw(_device_bytes())}
            for a, b in pairwise(bounds)
        ]
    return {
        "layers": layers,
        "model": {"max_model_len": max_model_len,
                  "auto_fit_max_model_len": draw(st.booleans())},
        "device": device,
        "scheduler": {
            "max_num_batched_tokens": draw(st.integers(1, 16384)),
            "max_concurrent_batches": draw(st.integers(1, 2)),
            "num_prefill_lookahead_tokens": draw(st.sampled_from([0, 0, 1, 3])),
        },
    }


@st.composite
def hybrid_hisparse_requests(draw: st.DrawFn, *, max_layers: int = 24) -> dict[str, Any]:
    """A HiSparse request whose other layers are of any section 7 kind."""
    request = draw(hisparse_requests(max_layers=max_layers, refusals=False))
    extra = draw(layer_pattern(
        max_layers=12,
        kinds=["full_attention", "sliding_window", "chunked_local_attention",
               "sliding_window_mla", "mamba"],
        prefix="model.other",
    ))
    request["layers"] = {
        name: spec for name, spec in request["layers"].items() if not name.startswith(
            "model.extra")
    } | extra
    request["scheduler"]["num_prefill_lookahead_tokens"] = draw(st.sampled_from([0, 1, 3]))
    request["device"]["available_bytes"] = draw(_device_bytes())
    return request
