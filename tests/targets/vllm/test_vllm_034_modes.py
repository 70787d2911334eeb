"""vLLM 0.34 and the modes vLLM runs by default (SPEC 7.13), pinned to figures vLLM 0.34's own
planner gave for the same requests (its engine flow on CPU: get_global_kv_cache_groups,
get_kv_cache_configs, finalize_extensible_kv_cache, get_max_concurrency_for_kv_cache_config).
The four golden `modes_*` cases pin align mode, the disabled hybrid manager, DCP 8 and
state_alignment; these tests pin the rest and the refusals."""

from __future__ import annotations

import copy
from typing import Any

import pytest

import hisparse_plan as hp
from hisparse_plan.models import MambaSpec
from support.golden import load

GIB = 2**30
ATTN = {"kind": "full_attention", "block_size": 16, "num_kv_heads": 8, "head_size": 128}
SLIDING = {**ATTN, "kind": "sliding_window", "sliding_window": 128}
CHUNKED = {**ATTN, "kind": "chunked_local_attention", "attention_chunk_size": 8192}
MAMBA = {"kind": "mamba", "block_size": 16, "state_shapes": [[3, 4096], [8, 64, 64]],
         "state_dtypes": ["bfloat16", "bfloat16"]}


def _request(layers: dict[str, Any], **scheduler: Any) -> dict[str, Any]:
    return {
        "layers": layers,
        "model": {"max_model_len": 4096},
        "device": {"available_bytes": 8 * GIB, "kv_cache_layout": "BLNHC"},
        "scheduler": scheduler,
    }


def test_a_stage_without_a_layer_of_a_group_plans_as_vllm_034() -> None:
    """vLLM 0.34: stage 0 keeps the sliding group with no layers and places no tensor for it;
    16384 blocks and max concurrency 16384 / 513 on both sides."""
    request = _request({"l0": ATTN, "l1": {**SLIDING, "head_size": 64, "sliding_window": 64},
                        "l2": {**ATTN, "head_size": 64}})
    request["device"]["pipeline_stages"] = [
        {"layers": ["l0"], "available_bytes": GIB},
        {"layers": ["l1", "l2"], "available_bytes": GIB},
    ]
    plan = hp.plan(request)
    hp.check_plan(plan, request=request)
    assert plan.num_blocks == 16384
    assert plan.capacity.max_concurrency == pytest.approx(31.937621832358673, rel=1e-15)
    assert [(t.layers, t.size, t.offset, t.layer_stride, t.block_stride) for t in plan.tensors] == [
        (["l0"], GIB, 0, 65536, 65536),
        (["l2"], GIB // 2, 0, 32768, 32768),
        (["l1"], GIB // 2, 0, 32768, 32768),
    ]


def test_refit_after_warmup_keeps_vllm_034_figures() -> None:
    """finalize_extensible_kv_cache with the measured block counts: Llama-3-8B at 50 GiB keeps
    25600 blocks (concurrency 50); Llama-3-70B on 4 stages at 8 GiB each re-fits its auto-fitted
    length to 104832 tokens with 6553 blocks."""
    request, _ = load("regular_llama3_8b_bf16")
    plan = hp.plan(request)
    refitted = hp.refit_after_warmup(request, plan, 50 * GIB)
    hp.check_plan(refitted)
    assert (refitted.num_blocks, refitted.capacity.max_concurrency) == (25600, 50.0)
    assert [t.size for t in refitted.tensors] == [25600 * plan.device_pool.bytes_per_block]
    assert [(t.offset, t.layer_stride, t.block_stride) for t in refitted.tensors] == [
        (t.offset, t.layer_stride, t.block_stride) for t in plan.tensors]
    staged, _ = load("regular_llama3_70b_pp4_autofit")
    refitted = hp.refit_after_warmup(staged, hp.plan(staged), [8 * GIB] * 4)
    assert (refitted.num_blocks, refitted.fitted_max_model_len) == (6553, 104832)
    assert round(refitted.capacity.max_concurrency, 6) == 1.000153


def test_refit_never_grows_and_refuses_what_no_longer_fits() -> None:
    request, _ = load("regular_llama3_8b_bf16")
    plan = hp.plan(request)
    assert hp.refit_after_warmup(request, plan, 80 * GIB).num_blocks == plan.num_blocks
    with pytest.raises(hp.CapacityError, match="estimated max_model_len"):
        hp.refit_after_warmup(request, plan, 3 * plan.device_pool.bytes_per_block)
    with pytest.raises(hp.PlanError, match=r"measured_bytes: expected one figure per"):
        hp.refit_after_warmup(request, plan, [GIB, GIB])
    other = copy.deepcopy(request)
    other["model"]["max_model_len"] = 4096
    with pytest.raises(hp.PlanInvariantError):
        hp.refit_after_warmup(other, plan, GIB)


def test_align_mode_counts_two_state_blocks_and_checkpoints() -> None:
    layers = {"a": ATTN, "m": {**MAMBA, "num_speculative_blocks": 1,
                               "num_prefill_checkpoint_blocks": 2}}
    request = _request(layers)
    request["device"]["kv_cache_layout"] = "BLHNC"
    none = hp.plan(request)
    request["model"]["mamba_cache_mode"] = "align"
    align = hp.plan(request)
    hp.check_plan(align, request=request)
    attention_blocks = 4096 // 16
    assert none.capacity.max_concurrency == none.num_blocks / (attention_blocks + 1 + 1)
    assert align.capacity.max_concurrency == align.num_blocks / (attention_blocks + 2 + 1 + 2)


def test_state_alignment_rounds_each_state() -> None:
    spec = MambaSpec.model_validate({**MAMBA, "state_shapes": [[3], [5]],
                                     "state_dtypes": ["float32", "bfloat16"],
                                     "state_alignment": 64})
    assert spec.page_size_bytes == 64 + 64
    with pytest.raises(ValueError, match="page_size_padded: expected a multiple of state_align"):
        MambaSpec.model_validate({**MAMBA, "state_alignment": 64, "page_size_padded": 98400})


def test_unified_pages_that_break_state_alignment_are_refused() -> None:
    """vLLM pads the Mamba page to the largest page and then fails an assertion."""
    request = _request({"a": ATTN, "m": {**MAMBA, "state_shapes": [[3]],
                                         "state_dtypes": ["float32"], "state_alignment": 3000}})
    request["device"]["kv_cache_layout"] = "LBNHC"
    with pytest.raises(hp.PlanError, match=r"layers\['m'\]\.state_alignment"):
        hp.plan(request)


def test_dcp_divides_the_tokens_of_sharded_layers_only() -> None:
    layers = {"s": ATTN, "r": {**ATTN, "dcp_sharded": False}}
    request = _request(layers, decode_context_parallel_size=4)
    request["device"]["kv_cache_layout"] = "BLHNC"
    plan = hp.plan(request)
    hp.check_plan(plan, request=request)
    # the two are no family (one sharded, one not): two groups, 4096 / 4 / 16 and 4096 / 16
    assert len(plan.groups) == 2
    assert plan.capacity.max_concurrency == plan.num_blocks / (64 + 256)


def test_dcp_beside_a_sharded_sliding_window_is_refused() -> None:
    request = _request({"a": ATTN, "w": SLIDING}, decode_context_parallel_size=2)
    with pytest.raises(hp.PlanError, match="decode_context_parallel_size: expected 1 beside"):
        hp.plan(request)
    request["layers"]["w"] = {**SLIDING, "dcp_sharded": False}
    hp.check_plan(hp.plan(request), request=request)


def test_hybrid_manager_off_promotes_local_layers() -> None:
    """gpt-oss-like: sliding and full layers become one full_attention spec (one group, one
    tensor), as vLLM's unify_hybrid_kv_cache_specs makes them."""
    request = _request({"w0": SLIDING, "f0": ATTN, "w1": SLIDING, "f1": ATTN},
                       disable_hybrid_kv_cache_manager=True)
    plan = hp.plan(request)
    hp.check_plan(plan, request=request)
    (group,) = plan.groups
    assert group.spec.kind == "full_attention"
    assert [t.layers for t in plan.tensors] == [["w0", "f0", "w1", "f1"]]
    assert plan.capacity.max_concurrency == plan.num_blocks / 256


def test_hybrid_manager_off_refuses_what_one_manager_cannot_plan() -> None:
    request = _request({"a": ATTN, "m": MAMBA}, disable_hybrid_kv_cache_manager=True)
    with pytest.raises(hp.PlanError, match="disable_hybrid_kv_cache_manager: with the hybrid"):
        hp.plan(request)
    mixed = _request({"w": SLIDING, "c": CHUNKED, "f": ATTN},
                     disable_hybrid_kv_cache_manager=True)
    plan = hp.plan(mixed)  # both promoted; their remembered window and chunk keep them apart
    hp.check_plan(plan, request=mixed)


@pytest.mark.parametrize(("key", "other", "named"), [
    ("attention_chunk_size", {**CHUNKED, "attention_chunk_size": 4096},
     "'l1' keeps chunks of 8192 tokens and 'l2' of 4096"),
    ("sliding_window", {**SLIDING, "sliding_window": 64},
     "'l1' keeps a sliding window of 128 tokens and 'l2' of 64"),
])
def test_hybrid_manager_off_refuses_two_chunk_or_window_sizes(
    key: str, other: dict[str, Any], named: str
) -> None:
    """Issue 28: vLLM (0.33 and 0.34) merges the promoted layers as one spec and raises "All
    attention layers in the same KV cache group must have the same window size" for two
    sizes; the planner planned them as one family."""
    first = CHUNKED if key == "attention_chunk_size" else SLIDING
    request = _request({"l0": ATTN, "l1": first, "l2": other},
                       disable_hybrid_kv_cache_manager=True)
    with pytest.raises(hp.PlanError, match="must have the same window size") as refused:
        hp.plan(request)
    assert named in str(refused.value)
    assert f"expected one {key}" in str(refused.value)
    assert refused.value.field == "scheduler.disable_hybrid_kv_cache_manager"
    # One size each, or the hybrid manager on, or an mla layer among them: vLLM plans them.
    hp.plan(_request({"l0": ATTN, "l1": first, "l2": first},
                     disable_hybrid_kv_cache_manager=True))
    hp.plan(_request({"l0": ATTN, "l1": first, "l2": other}))
    hp.plan(_request({"l0": ATTN, "l1": SLIDING, "l2": CHUNKED},
                     disable_hybrid_kv_cache_manager=True))


@pytest.mark.parametrize("aligned", ["mla", "sliding_window_mla"])
def test_hybrid_manager_off_promotes_a_window_mla_layer_into_one_mla_spec(aligned: str) -> None:
    """Issue 40: vLLM 0.34's `_promote_local_kv_cache_specs` makes a sliding_window_mla layer
    beside an mla layer MLA; `MLAAttentionSpec.merge` then compares the pages, not the
    `alignment` that pads them (576 leaves a 576-byte row's page of 16 rows as it is), so both
    layers are one mla spec: one group, one tensor. vLLM 0.34's figures for this request (its
    engine flow on CPU, references/vllm_diff.py's): 29127 blocks, page 18432, concurrency
    56.888672 at max_model_len 8192. The planner kept two specs in a uniform_type group."""
    latent = {"block_size": 16, "head_size": 576, "dtype": "bfloat16", "num_kv_heads": 1}
    layers = {"a": {**latent, "kind": "mla"},
              "b": {**latent, "kind": "sliding_window_mla", "sliding_window": 1024}}
    layers["a" if aligned == "mla" else "b"]["alignment"] = 576
    request = {**_request(layers, disable_hybrid_kv_cache_manager=True),
               "model": {"max_model_len": 8192},
               "device": {"available_bytes": GIB, "kv_cache_layout": "BLNHC"}}
    plan = hp.plan(request)
    hp.check_plan(plan, request=request)
    (group,) = plan.groups
    assert (group.spec.kind, group.spec.page_size_bytes, plan.num_blocks) == ("mla", 18432, 29127)
    assert [(t.layers, t.layer_stride, t.block_stride) for t in plan.tensors] == [
        (["a", "b"], 18432, 36864)]
    assert plan.capacity.max_concurrency == pytest.approx(56.888672, abs=1e-6)


def test_hisparse_auto_fit_stops_at_the_host_pool() -> None:
    request, _ = load("deepseek_v32_fp8")
    request = copy.deepcopy(request)
    request["model"]["auto_fit_max_model_len"] = True
    request["hisparse"]["host_pool_gib"] = 4
    plan = hp.plan(request)
    hp.check_plan(plan, request=request)
    assert plan.host_pool is not None
    fitted = plan.fitted_max_model_len
    assert fitted is not None
    assert fitted < 163840
    # the longest request the host pool holds beside the null block and copy-on-write tail
    assert fitted == (plan.host_pool.num_blocks - 2) * 64


@pytest.mark.parametrize(("case", "section", "field", "value"), [
    ("modes_deepseek_v32_dcp8", "workload", "decode_context_parallel_size", 1),
    ("modes_qwen3_next_80b_align", "workload", "mamba_cache_mode", "none"),
])
def test_check_plan_proves_the_modes(case: str, section: str, field: str, value: Any) -> None:
    """A plan's capacity follows its recorded mode: change the mode and the figures no longer
    agree (the checker re-derives them from the plan alone)."""
    request, _ = load(case)
    plan = hp.plan(request)
    hp.check_plan(plan)
    data = plan.model_dump(mode="json")
    data[section][field] = value
    with pytest.raises(hp.PlanInvariantError, match="capacity"):
        hp.check_plan(hp.KVCachePlan.model_validate(data))


def test_a_promoted_layer_is_its_own_spec_in_a_uniform_type_group() -> None:
    """With the hybrid manager off, a promoted sliding layer of another page is a member of
    the full-attention family: it keeps its own tensor (it remembers its window)."""
    request = _request({"w": {**SLIDING, "head_size": 64}, "f": ATTN},
                       disable_hybrid_kv_cache_manager=True)
    plan = hp.plan(request)
    hp.check_plan(plan, request=request)
    (group,) = plan.groups
    assert group.spec.kind == "uniform_type"
    assert [t.layers for t in plan.tensors] == [["w"], ["f"]]


def test_hisparse_with_dcp_shards_source_and_indexer_tokens() -> None:
    """As vLLM 0.34 plans it (three random HiSparse requests with DCP agree field for field):
    the MLA layers count ceil(L / dcp) tokens; resident and hot groups do not scale."""
    request, _ = load("deepseek_v32_fp8")
    base = hp.plan(request)
    sharded = copy.deepcopy(request)
    sharded["scheduler"] = {**sharded.get("scheduler", {}), "decode_context_parallel_size": 2}
    plan = hp.plan(sharded)
    hp.check_plan(plan, request=sharded)
    assert plan.host_pool is not None
    assert base.host_pool is not None
    # host-bound: 26832 host blocks / ceil(ceil(163840 / 2) / 64) blocks per request
    assert plan.capacity.max_concurrency == plan.host_pool.num_blocks / 1280
    assert base.capacity.max_concurrency == base.host_pool.num_blocks / 2560


def test_hisparse_with_the_hybrid_manager_off_is_refused_as_vllm_refuses_it() -> None:
    request, _ = load("deepseek_v32_fp8")
    request = copy.deepcopy(request)
    request["scheduler"] = {**request.get("scheduler", {}),
                            "disable_hybrid_kv_cache_manager": True}
    with pytest.raises(hp.UnsupportedRequestError, match="disable_hybrid_kv_cache_manager"):
        hp.plan(request)
