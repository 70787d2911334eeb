"""Extreme values at every entry point: only a PlanError or a ValidationError naming a field
comes out of request validation, plan() and check_plan(), and every plan is proved sound.

Sizes run up to the int64 limit, so products of heads, block sizes and dimensions overflow in
every combination; the planner's own models must not leak their ValidationErrors.
"""

from __future__ import annotations

import copy
import functools
import warnings
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

import hisparse_plan as hp
from hisparse_plan.presets import Settings, build_request, load_preset

INT64_MAX = 2**63 - 1
SIZES = st.one_of(
    st.sampled_from([1, 2, 3, 16, 64, 4096, 2**31, 2**32, 2**40, 2**61, 2**62,
                     INT64_MAX - 1, INT64_MAX]),
    st.integers(1, INT64_MAX),
)
LAYOUTS = ["LBNHC", "LBHNC", "LHBNC", "BLHNC", "BLNHC", "BHLNC"]
KINDS = ["full_attention", "sliding_window", "chunked_local_attention", "mla",
         "sliding_window_mla", "mamba"]


@st.composite
def extreme_spec(draw: st.DrawFn, kind: str, block_size: int) -> dict[str, Any]:
    spec: dict[str, Any] = {"kind": kind, "block_size": block_size}
    if kind == "mamba":
        spec["state_shapes"] = [draw(st.lists(SIZES, min_size=1, max_size=2))]
        spec["state_dtypes"] = ["float32"]
    else:
        spec["head_size"] = draw(SIZES)
        spec["dtype"] = draw(st.sampled_from(["uint8", "bfloat16", "float32"]))
        if kind != "mla" or draw(st.booleans()):
            spec["num_kv_heads"] = draw(SIZES)
        if kind in ("sliding_window", "sliding_window_mla"):
            spec["sliding_window"] = draw(SIZES)
        if kind == "chunked_local_attention":
            spec["attention_chunk_size"] = draw(SIZES)
        if kind in ("mla", "sliding_window_mla"):
            for field in ("compress_ratio", "alignment"):
                if draw(st.booleans()):
                    spec[field] = draw(SIZES)
        if draw(st.booleans()):
            spec["block_stride_alignment"] = draw(SIZES)
    if draw(st.booleans()):
        spec["page_size_padded"] = draw(SIZES)
    return spec


@st.composite
def extreme_requests(draw: st.DrawFn) -> dict[str, Any]:
    hisparse = draw(st.booleans())
    block_size = draw(SIZES)
    layers: dict[str, Any] = {}
    if hisparse:
        for i in range(draw(st.integers(1, 3))):
            source = draw(extreme_spec("mla", block_size))
            source.pop("num_kv_heads", None)
            source["is_index_group_leader"] = True
            indexer = draw(extreme_spec("mla", block_size))
            indexer.pop("num_kv_heads", None)
            indexer["cache_role"] = "indexer"
            layers[f"model.layers.{i}.attn"] = source
            layers[f"model.layers.{i}.indexer"] = indexer
    for i in range(draw(st.integers(0 if hisparse else 1, 3))):
        own = draw(st.one_of(st.just(block_size), SIZES))
        layers[f"model.other.{i}"] = draw(extreme_spec(draw(st.sampled_from(KINDS)), own))
    request: dict[str, Any] = {
        "layers": layers,
        "model": {"max_model_len": draw(SIZES)},
        "device": {"available_bytes": draw(SIZES),
                   "kv_cache_layout": draw(st.sampled_from(LAYOUTS))},
        "scheduler": {"max_num_batched_tokens": draw(SIZES),
                      "max_concurrent_batches": draw(SIZES)},
    }
    if draw(st.booleans()):
        request["device"]["num_blocks_override"] = draw(SIZES)
    if hisparse:
        request["model"]["index_topk"] = draw(SIZES)
        request["hisparse"] = {
            "host_pool_gib": draw(st.sampled_from([1.0, 1e6, 2.0**32, 8e9])),
            "max_decode_query_len": draw(SIZES),
        }
        if draw(st.booleans()):
            request["hisparse"]["device_buffer_size"] = draw(SIZES)
    return request


def _names_a_field(error: ValidationError) -> None:
    for detail in error.errors():
        assert detail["loc"], error


FOUND = {
    "layers": {
        "x0": {"kind": "mla", "block_size": 62771073, "head_size": 3976369, "dtype": "uint8",
               "compress_ratio": 16, "alignment": 3976369},
        "x1": {"kind": "full_attention", "block_size": 62771073, "head_size": 62771073,
               "dtype": "bfloat16", "num_kv_heads": 64, "page_size_padded": INT64_MAX},
    },
    "model": {"max_model_len": 17671391257},
    "device": {"available_bytes": 4096, "kv_cache_layout": "LBNHC",
               "num_blocks_override": 2**40},
    "scheduler": {"max_num_batched_tokens": 64, "max_concurrent_batches": 4096},
}
"""A uniform_type group whose pages sum past int64 (found by the strategy below)."""

EMPTY_PAGE = {
    "layers": {"x1": {"kind": "sliding_window_mla", "block_size": 593, "head_size": 1,
                      "dtype": "uint8", "num_kv_heads": 2**62, "sliding_window": 1,
                      "page_size_padded": 174, "compress_ratio": 1074804742117}},
    "model": {"max_model_len": 2},
    "device": {"available_bytes": 2**62, "kv_cache_layout": "BLHNC",
               "num_blocks_override": 4096},
}
"""Fewer tokens than compress_ratio: no state per block, so 2**62 heads of nothing."""


def _request_or_field_error(raw: dict[str, Any]) -> hp.PlanRequest | None:
    """The validated request, or None once its refusal is shown to name the user's field."""
    try:
        return hp.PlanRequest.model_validate(raw)
    except ValidationError as error:
        invalid = error
    assert invalid.title == "PlanRequest"
    _names_a_field(invalid)
    return None


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(extreme_requests())
@example(FOUND)
@example(EMPTY_PAGE)
def test_extreme_values_give_only_field_errors_and_sound_plans(raw: dict[str, Any]) -> None:
    request = _request_or_field_error(raw)
    if request is None:
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", hp.PlanWarning)
        try:
            plan: hp.KVCachePlan | None = hp.plan(request)
        except hp.PlanError as error:
            plan, refusal = None, str(error)
    if plan is None:
        assert refusal
        return
    hp.check_plan(plan)


def test_an_internal_model_refusal_names_the_layer() -> None:
    """Two pages each under int64 whose sum is not: the uniform_type group's page cannot be
    built, and the error says which layer's group, as a PlanError."""
    request = {
        "layers": {
            "model.layers.0.attn": {"kind": "full_attention", "block_size": 1, "head_size": 2,
                                    "dtype": "uint8", "num_kv_heads": 1},
            "model.layers.1.attn": {"kind": "full_attention", "block_size": 1, "head_size": 1,
                                    "dtype": "bfloat16", "num_kv_heads": 2,
                                    "page_size_padded": INT64_MAX},
        },
        "model": {"max_model_len": 1},
        "device": {"available_bytes": 2**32, "num_blocks_override": 2},
    }
    with pytest.raises(hp.PlanError, match=r"layers\['model\.layers\.0\.attn'\].*int64"):
        hp.plan(request)


def _mixed_page_plan() -> dict[str, Any]:
    """Four sparse layers, two of each page size, packed two by two into resident/hot groups."""
    layers: dict[str, Any] = {}
    for i, content in enumerate([1024, 1024, 512, 512]):
        layers[f"model.layers.{i}.attn"] = {
            "kind": "mla", "block_size": 64, "head_size": 1, "dtype": "uint8",
            "state_content_bytes": content, "is_index_group_leader": True}
        layers[f"model.layers.{i}.indexer"] = {
            "kind": "mla", "block_size": 64, "head_size": 1, "dtype": "uint8",
            "state_content_bytes": 512, "cache_role": "indexer"}
    request = {"layers": layers, "model": {"max_model_len": 1024, "index_topk": 64},
               "hisparse": {"host_pool_gib": 1.0}, "device": {"available_bytes": 2**32}}
    return hp.plan(request).model_dump(mode="json")


def test_a_reordered_source_group_is_an_invariant_error() -> None:
    """Reordered, the source group packs a 65536- and a 32768-byte page together: the shared
    packing rule refuses it, and check_plan reports that as a broken invariant."""
    plan = copy.deepcopy(_mixed_page_plan())
    source = plan["groups"][0]
    assert source["role"] == "hisparse_source"
    order = [0, 2, 1, 3]
    names = source["layer_names"]
    source["layer_names"] = [names[i] for i in order]
    members = list(source["spec"]["specs"].items())
    source["spec"]["specs"] = dict(members[i] for i in order)
    with pytest.raises(hp.PlanInvariantError, match="mixes page sizes") as caught:
        hp.check_plan(plan)
    assert caught.value.layer == "model.layers.0.attn"


# -- SGLang: the same matrix over SGLang's settings ------------------------------------------------


def _sglang_layers() -> dict[str, dict[str, Any]]:
    mha = {"kind": "full_attention", "block_size": 16, "num_kv_heads": 8, "head_size": 128,
           "dtype": "bfloat16"}
    window = {**mha, "kind": "sliding_window", "sliding_window": 128}
    latent = {"kind": "mla", "block_size": 64, "head_size": 576, "dtype": "bfloat16"}
    dsa = {**latent, "dtype": "uint8", "cache_dtype": "fp8_ds_mla", "state_content_bytes": 656}
    indexer = {"kind": "mla", "block_size": 64, "head_size": 132, "dtype": "uint8",
               "cache_role": "indexer"}
    mamba = {"kind": "mamba", "block_size": 4096, "state_shapes": [[3, 1024], [8, 64, 128]],
             "state_dtypes": ["bfloat16", "bfloat16"]}
    return {
        "mha": {"l0.attn": mha, "l1.attn": mha},
        "mha_kv_apart": {"l0.attn": {**mha, "head_size_v": 64}},
        "window": {"l0.attn": mha, "l1.attn": window},
        "mla": {"l0.attn": latent},
        "dsa": {"l0.attn": dsa, "l0.indexer": indexer, "l1.attn": dsa, "l1.indexer": indexer},
        "mamba": {"l0.mamba": mamba, "l1.attn": mha},
    }


SGLANG_LAYERS = _sglang_layers()


@functools.cache
def _deepseek_v4() -> dict[str, Any]:
    """DeepSeek-V4-Flash's layers and model section (SGLang's own V4 path plans it)."""
    arch = load_preset("deepseek-v4-flash").architecture
    raw = build_request(arch, Settings(max_model_len=4096)).model_dump(mode="json")
    return {"layers": raw["layers"], "model": raw["model"]}


def _sglang_model(kind: str) -> dict[str, Any]:
    if kind == "deepseek_v4":
        return _deepseek_v4()
    return {"layers": SGLANG_LAYERS[kind], "model": {"max_model_len": 4096}}
FRACTIONS = st.one_of(st.sampled_from([5e-324, 1e-300, 1e-9, 0.5, 1 - 2**-53]),
                      st.floats(0, 1, exclude_min=True, exclude_max=True))
RATIOS = st.one_of(st.sampled_from([5e-324, 1e-300, 1.0, 1e15, 1e300, 1.7e308]),
                   st.floats(0, 1.7e308, exclude_min=True))
MEMORY = st.sampled_from([0, 1, 2**30, 2**40, INT64_MAX])


@st.composite
def extreme_sglang_requests(draw: st.DrawFn) -> dict[str, Any]:
    """A small model of each SGLang pool kind, every setting drawn from its extremes."""
    kind = draw(st.sampled_from([*sorted(SGLANG_LAYERS), "deepseek_v4"]))
    engine: dict[str, Any] = {"name": "sglang", "context_length": draw(SIZES),
                              "tp_size": draw(SIZES), "mamba_full_memory_ratio": draw(RATIOS)}
    for field in ("page_size", "max_running_requests", "max_total_tokens",
                  "max_mamba_cache_size", "chunked_prefill_size"):
        engine[field] = draw(st.none() | SIZES)
    engine["swa_full_tokens_ratio"] = draw(st.none() | RATIOS)
    if draw(st.booleans()):
        engine["mem_fraction_static"] = draw(st.none() | FRACTIONS)
        engine["gpu_memory_bytes"] = draw(st.none() | MEMORY.filter(bool))
        if draw(st.booleans()):
            engine["pre_model_load_free_bytes"] = draw(MEMORY)
            engine["post_weights_free_bytes"] = draw(MEMORY)
    if kind == "dsa" and draw(st.booleans()):
        engine.update(enable_hisparse=True, hisparse_top_k=draw(SIZES),
                      hisparse_device_buffer_size=draw(st.none() | SIZES),
                      hisparse_host_to_device_ratio=draw(SIZES))
    engine["kv_cache_dtype"] = draw(st.sampled_from(["auto", "fp8_e4m3"]))
    return {
        **_sglang_model(kind),
        "device": {"available_bytes": draw(MEMORY | st.integers(0, INT64_MAX))},
        "engine": engine,
    }


def _sglang(kind: str, available: int = 2**40, **engine: Any) -> dict[str, Any]:
    return {**_sglang_model(kind), "device": {"available_bytes": available},
            "engine": {"name": "sglang", "context_length": 4096, **engine}}


HUGE_HEAD = {"l0.attn": {"kind": "full_attention", "block_size": 16, "num_kv_heads": 1,
                         "head_size": 2**33, "dtype": "bfloat16"}}
"""One layer whose token takes 2**35 bytes: a pool of few tokens and a page passes int64."""

SGLANG_FOUND = [
    # (request, the field the refusal names, what it says): each escaped plan_for_engine as a
    # ValidationError about the plan's own models (BufferView, SGLangBudget, SGLangHisparse,
    # Pool) or as a ValueError from a float that overflowed, or planned a request table past
    # int64 bytes.
    (_sglang("mha", context_length=INT64_MAX - 1), "engine.context_length",
     "the request-to-token table's bytes"),
    (_sglang("mha", context_length=2**61), "engine.context_length",
     "the request-to-token table's bytes"),
    (_sglang("mha", available=INT64_MAX), "device.available_bytes",
     "the KV budget in bytes would be 9223372036854775808"),
    (_sglang("mha", mem_fraction_static=0.5, pre_model_load_free_bytes=1,
             post_weights_free_bytes=INT64_MAX), "engine.post_weights_free_bytes",
     "the KV budget in bytes would be 9223372036854775808"),
    ({**_sglang("mha", available=INT64_MAX - 2**40, page_size=2**20), "layers": HUGE_HEAD},
     "device.available_bytes", "its pools (each the budget's tokens and a padding page"),
    (_sglang("dsa", enable_hisparse=True, hisparse_top_k=2**62), "engine.hisparse_top_k",
     "a request's hot rows"),
    (_sglang("dsa", enable_hisparse=True, hisparse_device_buffer_size=INT64_MAX - 1),
     "engine.hisparse_device_buffer_size", "a request's hot rows"),
    (_sglang("mamba", mamba_full_memory_ratio=1.7e308), "engine.mamba_full_memory_ratio",
     "the Mamba states' share of the budget in bytes overflows a float"),
    # More token ids than the request table's int32 entries hold (check_plan refuses them).
    (_sglang("mla", available=2**62), "device.available_bytes",
     "SGLang's request-to-token table holds int32 token ids"),
    (_sglang("dsa", enable_hisparse=True, hisparse_host_to_device_ratio=2**20),
     "engine.hisparse_host_to_device_ratio",
     "SGLang's request-to-token table holds int32 token ids"),
    (_sglang("deepseek_v4", available=INT64_MAX), "device.available_bytes",
     "the KV budget in bytes"),
    (_sglang("deepseek_v4", context_length=INT64_MAX - 3), "engine.context_length",
     "the request-to-token table's bytes"),
]


@pytest.mark.parametrize(("raw", "field", "says"), SGLANG_FOUND)
def test_extreme_sglang_settings_are_refused_by_name(
    raw: dict[str, Any], field: str, says: str
) -> None:
    with pytest.raises(hp.PlanError) as caught:
        hp.plan_for_engine(raw)
    assert caught.value.field == field
    assert str(caught.value).startswith(f"{field}: {says}"), caught.value


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(extreme_sglang_requests())
def test_extreme_sglang_settings_give_only_field_errors_and_sound_plans(
    raw: dict[str, Any],
) -> None:
    request = _request_or_field_error(raw)
    if request is None:
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", hp.PlanWarning)
        try:
            plan: hp.Plan | None = hp.plan_for_engine(request)
        except hp.PlanError as error:
            plan, refusal = None, error
    if plan is None:
        assert refusal.field is not None, refusal
        return
    hp.check_plan(plan)
