"""The vLLM adapter's pure parts, without vLLM: vLLM-shaped spec objects (duck-typed stand-ins
named like vLLM's classes) become request layers, engine settings become a request."""

from __future__ import annotations

import enum
from dataclasses import replace
from fractions import Fraction
from typing import Any

import pytest

import hisparse_plan as hp
from hisparse_plan.adapters.vllm import EngineSettings, HisparseSettings, request_dict
from hisparse_plan.adapters.vllm.layers import layer_dicts
from hisparse_plan.errors import UnsupportedRequestError
from hisparse_plan.models import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    LayerSpec,
    MambaSpec,
    MLASpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
)
from hisparse_plan.rules.arith import round_up
from support import golden


class Role(enum.Enum):
    SPARSE = "sparse"
    INDEXER = "indexer"


_CLASSES: dict[str, type] = {}


def fake(type_name: str, **attrs: Any) -> Any:
    """An object whose class is named like vLLM's and which carries `attrs`."""
    cls = _CLASSES.setdefault(type_name, type(type_name, (), {}))
    obj = cls()
    obj.__dict__.update(attrs)
    return obj


def _attention(spec: Any, **attrs: Any) -> dict[str, Any]:
    return {
        "block_size": spec.block_size, "num_kv_heads": spec.num_kv_heads,
        "head_size": spec.head_size, "dtype": f"torch.{spec.dtype}",
        "page_size_padded": spec.page_size_padded, "num_head_slots": None,
        "block_stride_alignment": spec.block_stride_alignment, "kv_quant_mode": 0,
        "max_tp_shards": None, "dcp_sharded": spec.dcp_sharded,
        "state_content_bytes": None,
        "tokens_per_state": 1, **attrs,
    }


def vllm_like(spec: LayerSpec) -> Any:
    """What vLLM 0.34 hands the planner for a layer of this spec (before the engine tags
    sliding windows)."""
    if isinstance(spec, MLASpec | SlidingWindowMLASpec):
        padded = spec.page_size_padded
        if spec.alignment is not None and spec.natural_page_bytes % spec.alignment:
            padded = round_up(spec.natural_page_bytes, spec.alignment)
        latent = _attention(
            spec, head_size_v=0, page_size_padded=padded, cache_dtype_str=spec.cache_dtype,
            state_content_bytes=spec.state_content_bytes, tokens_per_state=spec.compress_ratio,
            alignment=spec.alignment, model_version=spec.model_version,
        )
        if isinstance(spec, SlidingWindowMLASpec):
            return fake("SlidingWindowMLASpec", sliding_window=spec.sliding_window,
                        extra_retained_tokens=0, bounded_replay=False, **latent)
        return fake("MLAAttentionSpec", cache_role=Role(spec.cache_role),
                    is_index_group_leader=spec.is_index_group_leader,
                    topk_buffer_width=spec.topk_buffer_width, sliding_window=None,
                    attention_chunk_size=None, **latent)
    if isinstance(spec, MambaSpec):
        return fake("MambaSpec", block_size=spec.block_size,
                    shapes=tuple(tuple(shape) for shape in spec.state_shapes),
                    dtypes=tuple(f"torch.{dtype}" for dtype in spec.state_dtypes),
                    page_size_padded=spec.page_size_padded,
                    num_speculative_blocks=spec.num_speculative_blocks,
                    block_stride_alignment=spec.block_stride_alignment, num_heads=1,
                    tokens_per_state=-1, tp_replicated=False, mamba_cache_mode="none",
                    state_alignment=spec.state_alignment,
                    num_prefill_checkpoint_blocks=spec.num_prefill_checkpoint_blocks,
                    prefill_checkpoint_alignment=spec.prefill_checkpoint_alignment)
    kv = _attention(spec, head_size_v=spec.head_size_v)
    if isinstance(spec, SlidingWindowSpec):
        return fake("SlidingWindowSpec", sliding_window=spec.sliding_window,
                    extra_retained_tokens=0, **kv)
    if isinstance(spec, ChunkedLocalAttentionSpec):
        return fake("ChunkedLocalAttentionSpec", attention_chunk_size=spec.attention_chunk_size,
                    **kv)
    if isinstance(spec, CrossAttentionSpec):
        return fake("CrossAttentionSpec", **kv)
    assert isinstance(spec, FullAttentionSpec)
    return fake("FullAttentionSpec", sliding_window=spec.sliding_window,
                attention_chunk_size=None, non_causal=False, **kv)


def settings_of(request: hp.PlanRequest) -> EngineSettings:
    hisparse = request.hisparse
    return EngineSettings(
        max_model_len=request.model.max_model_len,
        index_topk=request.model.index_topk,
        auto_fit_max_model_len=request.model.auto_fit_max_model_len,
        kv_cache_layout=request.device.kv_cache_layout.value,
        num_blocks_override=request.device.num_blocks_override,
        max_num_batched_tokens=request.scheduler.max_num_batched_tokens,
        max_concurrent_batches=request.scheduler.max_concurrent_batches,
        num_prefill_lookahead_tokens=request.scheduler.num_prefill_lookahead_tokens,
        hisparse=None if hisparse is None else HisparseSettings(
            host_pool_bytes=int(hisparse.host_pool_gib * 2**30),
            device_buffer_size=hisparse.device_buffer_size,
            max_decode_query_len=hisparse.max_decode_query_len,
            shared_host_pool=hisparse.shared_host_pool,
        ),
        mamba_cache_mode=request.model.mamba_cache_mode,
        disable_hybrid_kv_cache_manager=request.scheduler.disable_hybrid_kv_cache_manager,
        decode_context_parallel_size=request.scheduler.decode_context_parallel_size,
    )


ONE_STAGE = [case for case in golden.CASES if not golden.load(case)[0]["device"].get(
    "pipeline_stages")]


@pytest.mark.parametrize("case", ONE_STAGE)
def test_vllm_specs_map_back_to_the_request(case: str) -> None:
    request = hp.PlanRequest.model_validate(golden.load(case)[0])
    specs = {name: vllm_like(spec) for name, spec in request.layers.items()}
    rebuilt = request_dict(specs, settings_of(request), request.device.available_bytes)
    assert _budget_in_bytes(hp.PlanRequest.model_validate(rebuilt)) == _budget_in_bytes(request)


def _budget_in_bytes(request: hp.PlanRequest) -> dict[str, Any]:
    """The request as data, its host budget in bytes (what a GiB figure means, SPEC 5.7)."""
    data = request.model_dump()
    if data["hisparse"] is not None:
        data["hisparse"]["host_pool_gib"] = int(data["hisparse"]["host_pool_gib"] * 2**30)
    return data


def test_derived_hisparse_specs_are_skipped() -> None:
    request = hp.PlanRequest.model_validate(golden.load("deepseek_v32_fp8")[0])
    specs = {name: vllm_like(spec) for name, spec in request.layers.items()}
    specs["x.hisparse_hot"] = fake("HiSparseHotSpec", block_size=64, page_size=1,
                                   blocks_per_request=1)
    assert list(layer_dicts(specs, 0)) == list(request.layers)


def test_engine_tagged_windows_map_like_untagged_ones() -> None:
    spec = SlidingWindowSpec(block_size=16, num_kv_heads=8, head_size=128, sliding_window=512)
    tagged = vllm_like(spec)
    tagged.extra_retained_tokens = 2
    assert layer_dicts({"a": tagged}, 2) == layer_dicts({"a": vllm_like(spec)}, 2)
    with pytest.raises(UnsupportedRequestError, match=r"layers\['a'\].*extra_retained_tokens"):
        layer_dicts({"a": tagged}, 1)


def test_alignment_padding_is_not_reported_as_extra_padding() -> None:
    spec = MLASpec(block_size=64, head_size=584, dtype="uint8", alignment=576)
    layer = layer_dicts({"m": vllm_like(spec)}, 0)["m"]
    assert "page_size_padded" not in layer
    assert layer["alignment"] == 576


_FULL = FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"num_head_slots": 4}, "num_head_slots"),
        ({"state_content_bytes": 100}, "state_content_bytes"),
        ({"tokens_per_state": Fraction(1, 2)}, "tokens_per_state"),
        ({"dtype": "torch.float64"}, "dtype"),
        ({"block_stride_alignment": fake("MultipleOf", base=16)}, "kernel blocks"),
    ],
)
def test_fields_the_contract_lacks_are_refused(change: dict[str, Any], match: str) -> None:
    spec = vllm_like(_FULL)
    spec.__dict__.update(change)
    with pytest.raises(UnsupportedRequestError, match=rf"layers\['x'\].*{match}"):
        layer_dicts({"x": spec}, 0)


def test_unknown_spec_types_are_refused_by_name() -> None:
    with pytest.raises(UnsupportedRequestError,
                       match=r"layers\['enc'\]: vLLM spec type EncoderOnlyAttentionSpec"):
        layer_dicts({"enc": fake("EncoderOnlyAttentionSpec", block_size=16)}, 0)


def test_a_cross_attention_spec_maps_to_a_cross_attention_layer() -> None:
    """Whisper's encoder_attn (vLLM's CrossAttentionSpec) keeps its kind and K/V geometry."""
    fields = {"block_size": 64, "num_kv_heads": 4, "head_size": 64, "dtype": "bfloat16"}
    spec = CrossAttentionSpec.model_validate(fields)
    layer = layer_dicts({"enc": vllm_like(spec)}, 0)["enc"]
    assert {key: layer[key] for key in ("kind", *fields)} == {"kind": "cross_attention",
                                                              **fields}
    assert hp.PlanRequest.model_validate({
        "layers": {"enc": layer}, "model": {"max_model_len": 448},
        "device": {"available_bytes": 2**30}}).layers["enc"] == spec


def test_layout_neutral_fields_must_agree_per_type() -> None:
    first = vllm_like(_FULL)
    second = vllm_like(_FULL)
    second.kv_quant_mode = 1
    with pytest.raises(UnsupportedRequestError, match=r"layers\['b'\].*kv_quant_mode.*'a'"):
        layer_dicts({"a": first, "b": second}, 0)
    second.kv_quant_mode = 0
    assert len(layer_dicts({"a": first, "b": second}, 0)) == 2


def test_settings_make_a_request_that_plans() -> None:
    request = hp.PlanRequest.model_validate(golden.load("regular_gemma3_27b_swa")[0])
    specs = {name: vllm_like(spec) for name, spec in request.layers.items()}
    settings = settings_of(request)
    built = request_dict(specs, settings, request.device.available_bytes)
    assert hp.plan(hp.PlanRequest.model_validate(built)) == hp.plan(request)


def _mamba(**changes: Any) -> Any:
    spec = vllm_like(MambaSpec(block_size=64, state_shapes=[[3, 4096]], state_dtypes=["bfloat16"]))
    spec.__dict__.update(changes)
    return spec


def test_mamba_fields_of_vllm_034_map_to_the_request() -> None:
    layer = layer_dicts({"m": _mamba(state_alignment=256, num_prefill_checkpoint_blocks=2,
                                     prefill_checkpoint_alignment=512)}, 0)["m"]
    assert (layer["state_alignment"], layer["num_prefill_checkpoint_blocks"],
            layer["prefill_checkpoint_alignment"]) == (256, 2, 512)


def test_mamba_defaults_and_vllm_033_specs_leave_the_fields_out() -> None:
    """vLLM 0.33's MambaSpec has no state_alignment; defaults are not written."""
    old = _mamba()
    del old.__dict__["state_alignment"]
    for spec in (old, _mamba()):
        layer = layer_dicts({"m": spec}, 0)["m"]
        assert not {"state_alignment", "num_prefill_checkpoint_blocks",
                    "prefill_checkpoint_alignment"} & set(layer)


@pytest.mark.parametrize(
    "spec",
    [_FULL, SlidingWindowSpec(block_size=16, num_kv_heads=8, head_size=128, sliding_window=64),
     ChunkedLocalAttentionSpec(block_size=16, num_kv_heads=8, head_size=128,
                               attention_chunk_size=256),
     MLASpec(block_size=64, head_size=576),
     SlidingWindowMLASpec(block_size=64, head_size=576, sliding_window=128)],
)
def test_dcp_sharded_maps_on_every_attention_kind(spec: LayerSpec) -> None:
    sharded = vllm_like(spec)
    sharded.dcp_sharded = True
    replicated = vllm_like(spec)
    replicated.dcp_sharded = False
    assert "dcp_sharded" not in layer_dicts({"a": sharded}, 0)["a"]
    assert layer_dicts({"a": replicated}, 0)["a"]["dcp_sharded"] is False
    replicated.dcp_sharded = "no"
    with pytest.raises(UnsupportedRequestError, match=r"layers\['a'\].*dcp_sharded"):
        layer_dicts({"a": replicated}, 0)


def test_engine_modes_are_written_only_when_set() -> None:
    request = hp.PlanRequest.model_validate(golden.load("regular_llama3_8b_bf16")[0])
    specs = {name: vllm_like(spec) for name, spec in request.layers.items()}
    plain = request_dict(specs, settings_of(request), request.device.available_bytes)
    assert "mamba_cache_mode" not in plain["model"]  # type: ignore[operator]
    assert not {"disable_hybrid_kv_cache_manager", "decode_context_parallel_size"} & set(
        plain["scheduler"]  # type: ignore[call-overload]
    )
    modes = replace(settings_of(request), mamba_cache_mode="align",
                    disable_hybrid_kv_cache_manager=True, decode_context_parallel_size=8)
    written = request_dict(specs, modes, request.device.available_bytes)
    assert written["model"]["mamba_cache_mode"] == "align"  # type: ignore[index]
    assert written["scheduler"]["disable_hybrid_kv_cache_manager"] is True  # type: ignore[index]
    assert written["scheduler"]["decode_context_parallel_size"] == 8  # type: ignore[index]


def _deepseek_v4_window(**attrs: Any) -> Any:
    """A SlidingWindowMLASpec as vLLM 0.34 builds it for DeepSeek-V4 (fp8_ds_mla cache, one
    layer of window 128: the sweep's transformers-default config)."""
    return fake("SlidingWindowMLASpec", **{
        **_attention(FullAttentionSpec(block_size=64, num_kv_heads=1, head_size=512),
                     head_size_v=0, max_tp_shards=1, sliding_window=128,
                     extra_retained_tokens=0, bounded_replay=False,
                     non_causal_multi_token_decode=False, kv_head_major_slots=False),
        **attrs})


def test_deepseek_v4_state_caches_keep_no_quant_mode_beside_fp8_caches() -> None:
    # vLLM 0.34: DeepseekV4SWACache.get_kv_cache_spec sets fp8_ds_mla and its quant mode;
    # CompressorStateCache.get_kv_cache_spec sets neither (float32 state, mode NONE).
    swa = _deepseek_v4_window(dtype="torch.uint8", cache_dtype_str="fp8_ds_mla",
                              kv_quant_mode=1, state_content_bytes=584, alignment=576,
                              page_size_padded=37440, model_version="deepseek_v4")
    state = _deepseek_v4_window(block_size=8, head_size=1024, dtype="torch.float32",
                                cache_dtype_str=None, kv_quant_mode=0, alignment=576,
                                page_size_padded=32832, model_version=None)
    layers = layer_dicts({"attn.swa_cache": swa, "attn.compressor.state_cache": state}, 0)
    built = {name: SlidingWindowMLASpec.model_validate(layer) for name, layer in layers.items()}
    assert built["attn.swa_cache"].page_size_bytes == 37440  # 64 * 584 rounded up to 576
    assert built["attn.swa_cache"].cache_dtype == "fp8_ds_mla"
    assert built["attn.compressor.state_cache"].page_size_bytes == 32832  # 8 * 1024 * 4 -> 576
    assert built["attn.compressor.state_cache"].cache_dtype is None
    # Two caches of one format with two quant modes are still ones the request cannot tell apart.
    other = _deepseek_v4_window(block_size=8, head_size=1024, dtype="torch.float32",
                                cache_dtype_str=None, kv_quant_mode=1, alignment=576,
                                page_size_padded=32832, model_version=None)
    with pytest.raises(UnsupportedRequestError, match=r"layers\['b'\].*kv_quant_mode.*'a'"):
        layer_dicts({"a": state, "b": other}, 0)
