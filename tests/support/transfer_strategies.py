"""Random pairs of plans for the transfer property: both engines, block sizes, layouts,
tensor-parallel sizes, pool sizes, HiSparse or not, window and Mamba layers, and a request's
blocks on each side. Each pair knows which refusal (if any) it must meet."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from hypothesis import assume, event
from hypothesis import strategies as st

import hisparse_plan as hp
from hisparse_plan.exchange.transfer import Instance, TransferRequest
from hisparse_plan.models.any_plan import Plan
from support.transfer_support import (
    StateCuts,
    attention_layers,
    deepseek_plan,
    plan_of,
    request_blocks,
    sglang_request,
    sglang_stages,
    vllm_request,
    vllm_stages,
)

LAYOUTS = ["LBNHC", "LBHNC", "LHBNC", "BLHNC", "BLNHC", "BHLNC"]
MIXED_PAGE_LAYOUTS = ["LBNHC", "LBHNC", "BLHNC", "BLNHC"]
"""Layouts that pack pages of two sizes in one block (latent rows beside index keys)."""
HOST_LAYOUTS = ["layer_outermost", "block_outermost"]
"""hisparse.host_pool_layout: vLLM's, and the placement option (docs/transfer.md)."""


@dataclass
class Pair:
    source: Instance
    destination: Instance
    request: TransferRequest
    firsts: dict[str, int] = field(default_factory=dict)
    """The first token each window layer needs."""
    refusal: frozenset[str] = frozenset()
    """The refusals (TransferRefused.what) the pair must meet; empty: it must move."""
    family: str = ""
    windows: dict[str, int] = field(default_factory=dict)
    """Each window layer's window (tokens)."""
    states: StateCuts | None = None
    """How the pair's states were drawn (the oracle's encoding of the full state)."""


def _freeze(layers: dict[str, dict[str, Any]]) -> tuple[tuple[str, str], ...]:
    return tuple((name, json.dumps(spec, sort_keys=True)) for name, spec in layers.items())


@lru_cache(maxsize=512)
def _plan(engine: str, layers: tuple[tuple[str, str], ...],
          knobs: tuple[tuple[str, Any], ...]) -> Plan:
    given = {name: json.loads(spec) for name, spec in layers}
    options = dict(knobs)
    if engine == "sglang":
        return plan_of(sglang_request(given, page_size=options["page"], tokens=options["tokens"],
                                      context_length=512,
                                      available=options.get("available", 2**30)))
    request = vllm_request(given, layout=options["layout"], available=2**40, max_model_len=512)
    request["device"]["num_blocks_override"] = options["blocks"]
    if "mamba_cache_mode" in options:
        request["model"]["mamba_cache_mode"] = options["mamba_cache_mode"]
    return plan_of(request)


def plan(engine: str, layers: dict[str, dict[str, Any]], **knobs: Any) -> Plan | None:
    try:
        return _plan(engine, _freeze(layers), tuple(sorted(knobs.items())))
    except hp.PlanError:
        return None


ENGINES = [("vllm", "vllm"), ("vllm", "sglang"), ("sglang", "vllm"), ("sglang", "sglang")]


@st.composite
def engine_side(draw: st.DrawFn, engine: str, layouts: list[str] = LAYOUTS) -> dict[str, Any]:
    """Where one side runs: the engine's block geometry (vLLM: layout, block size and pool
    blocks; SGLang: page size and pool tokens)."""
    if engine == "sglang":
        return {"engine": engine, "page": draw(st.sampled_from([1, 16, 64])),
                "tokens": draw(st.sampled_from([512, 768]))}
    return {"engine": engine, "layout": draw(st.sampled_from(layouts)),
            "block": draw(st.sampled_from([16, 32, 64])),
            "blocks": draw(st.integers(40, 64))}


def tensor_parallel(draw: st.DrawFn, heads: int) -> int:
    """A TP size the heads split over (or replicate across)."""
    return draw(st.sampled_from([tp for tp in (1, 2, 4) if heads % tp == 0 or tp % heads == 0]))


def _instance(side: dict[str, Any], layers: dict[str, dict[str, Any]], tp: int, total: int,
              **extra: Any) -> Instance | None:
    knobs = {key: value for key, value in side.items() if key not in ("engine", "block")}
    made = plan(side["engine"], layers, **knobs, **extra)
    return None if made is None else Instance([made] * tp, total_kv_heads=total)


def _blocks(draw: st.DrawFn, src: Instance, dst: Instance, tokens: int) -> TransferRequest:
    seed = draw(st.integers(0, 2**16))
    order = draw(st.sampled_from(["shuffled", "runs", "packed"]))
    runs, packed = order == "runs", order == "packed"
    try:
        return TransferRequest(
            num_tokens=tokens,
            source_blocks=request_blocks(src, tokens, seed, runs=runs, packed=packed),
            destination_blocks=request_blocks(dst, tokens, seed + 1, runs=runs, packed=packed))
    except ValueError:
        assume(False)
        raise


@st.composite
def dense_pairs(draw: st.DrawFn) -> Pair:
    """GQA/MHA attention layers, each side its engine, blocks, layout and TP."""
    total = draw(st.sampled_from([1, 2, 4, 8]))
    count = draw(st.integers(1, 3))
    head_size = draw(st.sampled_from([8, 16]))
    dtype = draw(st.sampled_from(["bfloat16", "float16"]))
    v_size = head_size // 2 if draw(st.integers(0, 5)) == 0 else None
    sides = []
    for engine in draw(st.sampled_from(ENGINES)):
        side = draw(engine_side(engine))
        tp = tensor_parallel(draw, total)
        block = side.get("block", 16)
        layers = attention_layers(count, max(1, total // tp), head_size=head_size,
                                  dtype=dtype, block=block, head_size_v=v_size)
        made = _instance(side, layers, tp, total)
        assume(made is not None)
        sides.append(made)
    tokens = draw(st.integers(1, 200))
    src, dst = sides[0], sides[1]
    assert src is not None
    assert dst is not None
    return Pair(src, dst, _blocks(draw, src, dst, tokens), family="dense")


@st.composite
def window_pairs(draw: st.DrawFn) -> Pair:
    """A sliding-window layer beside a full one; SGLang keeps the window in its swa pool."""
    total = draw(st.sampled_from([2, 4]))
    window = draw(st.sampled_from([16, 40, 100]))
    sides, engines = [], []
    for engine in draw(st.sampled_from(ENGINES)):
        side = draw(engine_side(engine))
        tp = tensor_parallel(draw, total)
        block = side.get("block", 16)
        heads = max(1, total // tp)
        layers = attention_layers(1, heads, block=block, window=window) | attention_layers(
            1, heads, block=block, first=1)
        made = _instance(side, layers, tp, total)
        assume(made is not None)
        sides.append(made)
        engines.append(side["engine"])
    src, dst = sides[0], sides[1]
    assert src is not None
    assert dst is not None
    if engines == ["sglang", "sglang"]:
        windows = {"model.layers.0.self_attn.attn": window}
        src = Instance(src.plans, src.total_kv_heads, windows)
    tokens = draw(st.integers(1, 250))
    firsts = {"model.layers.0.self_attn.attn": max(0, tokens - window)}
    return Pair(src, dst, _blocks(draw, src, dst, tokens), firsts, family="window",
                windows={"model.layers.0.self_attn.attn": window})


CONV, HEADS = (16, 8, 8), 4
"""The drawn Mamba states: a conv state of 32 channels in three blocks (x | B | C), each
sharded on its own, and a temporal state of 4 heads."""


def mamba_spec(tp: int, block: int) -> dict[str, Any]:
    """One rank's share of the states (vLLM's conv layout, kernel - 1 first; SGLang's plan
    keeps channels first)."""
    return {"kind": "mamba", "state_shapes": [[3, sum(CONV) // tp], [HEADS // tp, 4, 8]],
            "state_dtypes": ["bfloat16", "float32"], "block_size": block}


@st.composite
def mamba_pairs(draw: st.DrawFn) -> Pair:
    """Mamba layers beside attention, one engine on both sides, each side its TP: states
    move rank to rank, or between TP sizes as pieces of the full state (the conv blocks
    given by one side's instance), from the source's last state block to the
    destination's."""
    engine = draw(st.sampled_from(["vllm", "vllm", "sglang"]))
    sides = []
    given = draw(st.integers(0, 1))
    # Mostly two TP sizes (the first choices are the ones drawn most).
    tps = draw(st.sampled_from([(2, 1), (1, 2), (4, 2), (1, 4), (2, 2), (4, 1), (2, 4),
                                (1, 1)]))
    for index, tp in enumerate(tps):
        side = draw(engine_side(engine, MIXED_PAGE_LAYOUTS))
        block = side.get("block", 16)
        layers = {f"model.layers.{i}.linear_attn": mamba_spec(tp, block)
                  for i in range(2)} | attention_layers(1, 4 // tp, block=block, first=2)
        mode = draw(st.sampled_from(["none", "align"]))
        # SGLang's Mamba slots take what the budget leaves: a small one keeps them few.
        extra = {"available": 2**20} if engine == "sglang" else {"mamba_cache_mode": mode}
        made = _instance(side, layers, tp, 4, **extra)
        assume(made is not None)
        assert made is not None
        sides.append(Instance(made.plans, made.total_kv_heads,
                              state_groups=CONV if index == given else None))
    src, dst = sides[0], sides[1]
    tokens = draw(st.integers(1, 250))
    cuts: StateCuts = {0: (1 if engine == "vllm" else 0, CONV), 1: (0, (HEADS,))}
    return Pair(src, dst, _blocks(draw, src, dst, tokens), family="mamba", states=cuts)


@lru_cache(maxsize=64)
def _stages(engine: str, pp: int, tp: int, unit: int) -> Instance | None:
    try:
        if engine == "sglang":
            return sglang_stages(pp, tp, page=unit)
        return vllm_stages(pp, tp, block=unit)
    except hp.PlanError:
        return None


@st.composite
def pipeline_pairs(draw: st.DrawFn) -> Pair:
    """Pipeline stages on either side, any PP and TP: SGLang's pipeline ranks each plan
    their own layers, vLLM's plan holds every stage (a pool each). Each layer moves from its
    prefill stage's ranks to its decode stage's."""
    sides = []
    for engine in draw(st.sampled_from(ENGINES)):
        made = _stages(engine, draw(st.sampled_from([1, 2, 4])), draw(st.sampled_from([1, 2])),
                       draw(st.sampled_from([16, 64])))
        assume(made is not None)
        sides.append(made)
    src, dst = sides[0], sides[1]
    assert src is not None
    assert dst is not None
    tokens = draw(st.integers(1, 200))
    return Pair(src, dst, _blocks(draw, src, dst, tokens), family="pipeline")


@lru_cache(maxsize=256)
def _deepseek(engine: str, hisparse: bool, layers: int, layout: str, block: int,
              kv_dtype: str, host_layout: str = "layer_outermost") -> Plan | None:
    try:
        # Small pools (the property runs 1,000 pairs): the HiSparse host pool and device
        # bytes the least that still plan a 1,024-token request.
        return deepseek_plan(engine=engine, hisparse=hisparse, layers=layers, layout=layout,
                             block=block, kv_dtype=kv_dtype, blocks=40,
                             hisparse_bytes=(2**21, 2**23), host_layout=host_layout)
    except hp.PlanError:
        return None


@st.composite
def mla_pairs(draw: st.DrawFn) -> Pair:
    """DeepSeek-V3.2's latent rows and index keys: vLLM with or without HiSparse, SGLang with
    or without; rows replicated over any TP. Another page size or row format is refused."""
    layers = draw(st.integers(1, 2))
    kv_dtype = draw(st.sampled_from(["fp8_ds_mla", "bfloat16"]))
    dtypes, blocks, sides = [], [], []
    for engine in draw(st.sampled_from(ENGINES)):
        block = 32 if engine == "vllm" and draw(st.integers(0, 9)) == 0 else 64
        dtype = kv_dtype if draw(st.integers(0, 9)) else draw(
            st.sampled_from(["fp8_ds_mla", "bfloat16"]))
        hisparse = draw(st.booleans())
        # vLLM's HiSparse device pool packs index keys beside resident and hot pages.
        layouts = ["BLHNC", "BLNHC"] if hisparse and engine == "vllm" else MIXED_PAGE_LAYOUTS
        # A vLLM HiSparse host pool layer- or block-outermost (the placement option).
        host = draw(st.sampled_from(HOST_LAYOUTS)) if hisparse and engine == "vllm" else (
            HOST_LAYOUTS[0])
        made = _deepseek(engine, hisparse, layers, draw(st.sampled_from(layouts)), block,
                         dtype, host)
        assume(made is not None)
        if host != HOST_LAYOUTS[0]:
            event(f"mla: a {host} HiSparse host pool")
        assert made is not None
        # SGLang's plan stores the fp8 rows as uint8 without naming them: the side says so.
        fp8 = "fp8_e4m3" if dtype == "fp8_ds_mla" and engine == "sglang" else None
        sides.append(Instance([made] * draw(st.integers(1, 4)), cache_dtype=fp8))
        dtypes.append(dtype)
        blocks.append(block)
    refusal: set[str] = set()
    if dtypes[0] != dtypes[1]:
        refusal |= {"cache_dtype", "latent.dtype", "latent.bytes"}
    if blocks[0] != blocks[1]:
        # The index keys' layer may be met first (before the latent rows' format).
        refusal.add("block_size")
    tokens = draw(st.integers(1, 300))
    src, dst = sides
    return Pair(src, dst, _blocks(draw, src, dst, tokens), refusal=frozenset(refusal),
                family="mla")


def pairs() -> st.SearchStrategy[Pair]:
    return st.one_of(dense_pairs(), mla_pairs(), window_pairs(), mamba_pairs(),
                     pipeline_pairs())
