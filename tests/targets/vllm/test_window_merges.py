"""SPEC 7.12: sliding_window_mla layers that share a window but differ are refused exactly where
vLLM 0.33 would merge them into one spec (its uniform-spec test, its unified-pages bucketing);
elsewhere each keeps its own spec, as DeepSeek-V4's compressor states need."""

from __future__ import annotations

from typing import Any

import pytest

import hisparse_plan as hp
from hisparse_plan.models import UniformTypeSpec

GIB = 2**30
SWMLA = {"kind": "sliding_window_mla", "block_size": 16, "head_size": 576,
         "sliding_window": 64}
FULL = {"kind": "full_attention", "block_size": 16, "num_kv_heads": 8, "head_size": 128}

# One DeepSeek-V4 decoder layer of each kind, as vLLM 0.33 registers their caches with
# fp8_ds_mla: the sliding-window cache, the compressed cache, the indexer keys and the
# compressor states (float32 kv + score, window = compress ratio, x2 when it overlaps).
V4_ROW = {"head_size": 512, "dtype": "uint8", "state_content_bytes": 584,
          "cache_dtype": "fp8_ds_mla", "alignment": 576, "model_version": "deepseek_v4"}
V4_SWA = {"kind": "sliding_window_mla", "block_size": 64, "sliding_window": 128, **V4_ROW}


def _v4_compressed(ratio: int) -> dict[str, Any]:
    return {"kind": "mla", "block_size": 256, "compress_ratio": ratio, **V4_ROW}


def _v4_state(floats: int, block: int, window: int) -> dict[str, Any]:
    return {"kind": "sliding_window_mla", "block_size": block, "head_size": floats,
            "dtype": "float32", "sliding_window": window, "alignment": 576}


V4_LAYERS = {
    "model.layers.0.attn.swa_cache": V4_SWA,
    "model.layers.1.attn.swa_cache": V4_SWA,
    "model.layers.2.attn.indexer.k_cache": {"kind": "mla", "block_size": 256, "head_size": 132,
                                            "dtype": "uint8", "compress_ratio": 4,
                                            "alignment": 576},
    "model.layers.2.attn.indexer.compressor.state_cache": _v4_state(512, 4, 8),
    "model.layers.2.attn.swa_cache": V4_SWA,
    "model.layers.2.attn": _v4_compressed(4),
    "model.layers.2.attn.compressor.state_cache": _v4_state(2048, 4, 8),
    "model.layers.3.attn.swa_cache": V4_SWA,
    "model.layers.3.attn": _v4_compressed(128),
    "model.layers.3.attn.compressor.state_cache": _v4_state(1024, 8, 128),
}


def _request(layers: dict[str, Any], layout: str = "BLHNC") -> dict[str, Any]:
    return {
        "layers": layers,
        "model": {"max_model_len": 65536},
        "device": {"available_bytes": 4 * GIB, "kv_cache_layout": layout},
    }


def test_all_sliding_window_mla_layers_vllm_would_merge_are_refused() -> None:
    """vLLM's uniform test merges x and y (its merge compares neither sizes nor block sizes)
    and would plan y with x's 576-element rows."""
    request = _request({"x": SWMLA, "y": {**SWMLA, "head_size": 512}})
    with pytest.raises(hp.PlanError) as refused:
        hp.plan(request)
    message = str(refused.value)
    assert message.startswith("layers['y']: sliding_window_mla layers that share window 64")
    assert "uniform-spec test must be identical;" in message
    assert "expected the spec of 'x', got one that differs in" in message
    assert "head_size" in message
    assert refused.value.field == "layers['y']"


def test_unified_pages_merge_is_refused() -> None:
    """Beside a full-attention layer, at a layer-outer layout, vLLM pads both pages to the
    largest and then joins a and b into one bucket, whose groups take a's 16-token blocks
    whenever the group size keeps a and b together (see the one-page case below)."""
    request = _request({"f": FULL, "a": SWMLA, "b": {**SWMLA, "block_size": 32}}, "LBNHC")
    with pytest.raises(hp.PlanError, match=r"layers\['b'\]: .*unified-pages bucketing "
                       r"\(7\.3\.2\) must be identical; expected the spec of 'a'.*block_size"):
        hp.plan(request)


def test_unified_pages_of_one_size_in_a_block_outermost_layout_are_refused() -> None:
    """One distinct page: even a block-outermost layout unifies pages (7.3 rule 3 needs more
    than one page). vLLM 0.33 joins a and b into one bucket and, with two f layers setting the
    group size to 2, plans them as one group of 16-token blocks: b's 32-token blocks lost."""
    one_page = {**FULL, "num_kv_heads": 1, "head_size": 288}  # 16 * 576 * 2 bytes, like a's
    b = {**SWMLA, "block_size": 32, "head_size": 288}  # 32 * 288 * 2 bytes: the same page
    request = _request({"f": one_page, "f2": one_page, "a": SWMLA, "b": b}, "BLHNC")
    with pytest.raises(hp.PlanError, match=r"layers\['b'\]: .*unified-pages bucketing"):
        hp.plan(request)


def test_packed_groups_keep_each_layers_own_spec() -> None:
    """Pages that differ in a block-outermost layout are packed (7.3.1): a and b keep their own
    block sizes and pages, as in vLLM 0.33, so nothing is refused."""
    request = _request({"f": FULL, "a": SWMLA, "b": {**SWMLA, "block_size": 32}}, "BLHNC")
    plan = hp.plan(request)
    hp.check_plan(plan, request=request)
    assert [(g.layer_names, g.spec.block_size, g.spec.page_size_bytes) for g in plan.groups] == [
        (["f"], 16, 65536), (["a"], 16, 18432), (["b"], 32, 36864),
    ]


def test_layers_vllm_never_merges_plan_as_one_family() -> None:
    """Different cache dtypes: vLLM's merge refuses them, its uniform type keeps both specs."""
    other = {**SWMLA, "head_size": 656, "dtype": "uint8", "cache_dtype": "fp8_ds_mla"}
    request = _request({"x": SWMLA, "y": other})
    plan = hp.plan(request)
    hp.check_plan(plan, request=request)
    (group,) = plan.groups
    assert isinstance(group.spec, UniformTypeSpec)
    assert [member.page_size_bytes for member in group.spec.specs.values()] == [18432, 10496]


@pytest.mark.parametrize("layout", ["BLHNC", "BLNHC"])
def test_v4_shaped_request_plans_with_each_layers_own_spec(layout: str) -> None:
    request = _request(V4_LAYERS, layout)
    plan = hp.plan(request)
    hp.check_plan(plan, request=request)
    states = [g for g in plan.groups if g.spec.block_size == 4]
    assert [g.layer_names for g in states] == [[
        "model.layers.2.attn.indexer.compressor.state_cache",
        "model.layers.2.attn.compressor.state_cache",
    ]]
    spec = states[0].spec
    assert isinstance(spec, UniformTypeSpec)
    assert [member.page_size_bytes for member in spec.specs.values()] == [8640, 32832]
    window_128 = {name for g in plan.groups for name in g.layer_names
                  if g.spec.block_size in (8, 64)}
    assert "model.layers.3.attn.compressor.state_cache" in window_128
    # the widest group: indexer keys 8640 + compressed 37440 + 1728 (256-token blocks)
    assert plan.device_pool.bytes_per_block == 8640 + 37440 + 1728


def test_v4_shaped_request_at_a_layer_outer_layout_takes_the_full_allocation_fallback() -> None:
    """The indexer page does not divide the largest page, so pages cannot be unified; vLLM 0.34
    (unlike 0.33) then gives the sliding_window_mla layers full allocation at the MLA layers'
    256-token blocks: one uniform_type group (figures checked against vLLM 0.34)."""
    request = _request(V4_LAYERS, "LBNHC")
    plan = hp.plan(request)
    hp.check_plan(plan, request=request)
    (group,) = plan.groups
    assert isinstance(group.spec, UniformTypeSpec)
    assert (group.spec.block_size, group.spec.page_size_bytes) == (256, 4317696)
    assert {member.kind for member in group.spec.specs.values()} == {"mla"}
    swa = group.spec.specs["model.layers.0.attn.swa_cache"]
    assert swa.kind == "mla"
    assert swa.sliding_window == 128
    assert (plan.num_blocks, round(plan.capacity.max_concurrency, 6)) == (994, 3.882812)
