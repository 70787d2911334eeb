"""Window hybrids in SGLang pipeline stages, against SGLang 0.5.23's own figures: Llama-4's
window layers by their place in the whole model (get_hybrid_layer_ids), a rank of window
layers only sized as SGLang's all-window pool (no full pool, no ratio), and the splits SGLang
cannot run refused. The figures are literals computed with SGLang's own code by the reference
harness, every rank configured, SGLang not imported here:

    python references/sglang_diff.py --cases CASE.json --dump

with CASE.json `{"name", "config", "server_args", "memory"}` as `case()` below writes it
(all agree, or both refuse, field by field)."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import pytest

from hisparse_plan.adapters.sglang import pool_kwargs, rank_plans, request_from_server_args
from hisparse_plan.checking import check_plan
from hisparse_plan.errors import PlanInvariantError, UnsupportedRequestError
from hisparse_plan.models.request import PlanRequest
from hisparse_plan.models.sglang_plan import SGLangPlan
from hisparse_plan.targets.sglang import plan_sglang
from support import paths

FIXTURES = paths.HF_CONFIGS
MEMORY = {"pre_model_load_free_bytes": 149_250_113_536, "post_weights_free_bytes": 120_000_000_000}


def _config(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((FIXTURES / name / "config.json").read_text())
    return loaded


def llama4(layers: int) -> dict[str, Any]:
    cfg = copy.deepcopy(_config("llama-4-scout-17b-16e-instruct"))
    cfg["text_config"]["num_hidden_layers"] = layers
    return cfg


def gpt_oss(layers: int) -> dict[str, Any]:
    cfg = copy.deepcopy(_config("gpt-oss-120b"))
    cfg.update(num_hidden_layers=layers, layer_types=[
        ("sliding_attention", "full_attention")[i % 2] for i in range(layers)])
    return cfg


def case(config: dict[str, Any], pp: int, **server_args: Any) -> PlanRequest:
    args = {"tp_size": 8, "context_length": 8192, "mem_fraction_static": 0.85, "pp_size": pp,
            **server_args}
    return request_from_server_args(config, args, MEMORY)


def decoder_layers(plan: SGLangPlan, pool: str) -> list[int]:
    return sorted({int(m.group(1)) for t in plan.tensors if t.pool == pool for n in t.layers
                   if (m := re.search(r"layers\.(\d+)(?:\.|$)", n))})


def tokens(plan: SGLangPlan, pool: str) -> int | None:
    found = next((p for p in plan.pools if p.name == pool), None)
    return None if found is None else (found.num_blocks - 1) * plan.page_size


def test_scout_in_two_stages_places_window_layers_by_model_position() -> None:
    """Scout's 48 layers, 24 a rank: each rank's full layers are every 4th of the whole model
    (3..23, then 27..47), both ranks at SGLang's 9,345,557 tokens and 10,444.8-byte cell."""
    plans = rank_plans(case(llama4(48), 2))
    for plan, full in zip(plans, (range(3, 24, 4), range(27, 48, 4)), strict=True):
        assert plan.max_total_num_tokens == 9_345_557
        assert tokens(plan, "swa") == 7_476_445
        assert plan.budget.cell_size_bytes == 10444.8
        assert plan.budget.available_bytes == 97_612_482_969
        assert plan.max_running_requests == 4096
        assert decoder_layers(plan, "kv") == list(full)
        check_plan(plan)


def test_a_rank_of_window_layers_only_is_sglangs_all_window_pool() -> None:
    """Llama-4 of 6 layers in two stages: rank 0 keeps layers 0-2, all window. SGLang sizes it
    without a full pool or a ratio (cell 3 x 512 = 1536 bytes), its 63,549,793 tokens the
    fewest, so rank 1 (one full layer, cell 512 + 0.8 x 1024) takes them too and its window
    pool 0.8 of them."""
    rank0, rank1 = rank_plans(case(llama4(6), 2))
    assert [p.name for p in rank0.pools] == ["swa"]
    assert (rank0.budget.cell_size_bytes, rank1.budget.cell_size_bytes) == (1536, 1331.2)
    assert rank0.max_total_num_tokens == rank1.max_total_num_tokens == 63_549_793
    assert tokens(rank0, "swa") == 63_549_793
    assert (tokens(rank1, "kv"), tokens(rank1, "swa")) == (63_549_793, 50_839_834)
    assert decoder_layers(rank0, "swa") == [0, 1, 2]
    assert (decoder_layers(rank1, "kv"), decoder_layers(rank1, "swa")) == ([3], [4, 5])
    for plan in (rank0, rank1):
        check_plan(plan)


def test_the_radix_off_request_cap_skips_a_rank_of_window_layers_only() -> None:
    """The radix cache off with 8 running requests: rank 1 caps its window pool at 70,673
    tokens; rank 0 has no full layer, so SGLang's cap does not apply there and its window pool
    keeps every token."""
    rank0, rank1 = rank_plans(case(llama4(6), 2, disable_radix_cache=True,
                                   max_running_requests=8))
    assert tokens(rank0, "swa") == rank0.max_total_num_tokens == 63_549_793
    assert tokens(rank1, "swa") == 70_673
    assert rank1.max_running_requests == 8
    for plan in (rank0, rank1):
        check_plan(plan)


@pytest.mark.parametrize(
    ("config", "pp", "args", "field", "match"),
    [
        # SGLang: "AssertionError: Hybrid SWA model must have at least one SWA layer".
        (gpt_oss(3), 3, {}, "engine.pp_size", r"rank 1, decoder layers \[1, 2\).*full-attention"),
        # SGLang: PureSWATokenToKVPoolAllocator's `assert page_size == 1`.
        (llama4(6), 2, {"page_size": 64}, "engine.page_size", r"rank 0.*expected 1, got 64"),
    ],
)
def test_splits_sglang_cannot_run_are_refused(
    config: dict[str, Any], pp: int, args: dict[str, Any], field: str, match: str
) -> None:
    with pytest.raises(UnsupportedRequestError, match=match) as info:
        plan_sglang(case(config, pp, **args))
    assert info.value.field == field


def _window_only_plan() -> dict[str, Any]:
    plan: dict[str, Any] = rank_plans(case(llama4(6), 2))[0].model_dump(mode="json")
    return plan


def test_check_plan_refuses_a_window_only_rank_not_as_sglang_builds_it() -> None:
    """The checker's own arithmetic: the window pool holds max_total_num_tokens beside its
    padding page, the cell is its bytes a token whole (3 layers x 2 x 128 x 2 bytes), pages of
    one token, and only a pipeline rank may lack the full pool."""
    plan = _window_only_plan()
    assert plan["budget"]["cell_size_bytes"] == 3 * 2 * 128 * 2
    check_plan(plan)
    cell = copy.deepcopy(plan)
    cell["budget"]["cell_size_bytes"] = 1535
    with pytest.raises(PlanInvariantError, match="window pool whole"):
        check_plan(cell)
    alone = copy.deepcopy(plan)
    alone["pipeline"] = None
    with pytest.raises(PlanInvariantError, match="no pool 'kv'"):
        check_plan(alone)
    short = copy.deepcopy(plan)
    short["max_total_num_tokens"] -= 1
    with pytest.raises(PlanInvariantError, match="pool 'swa' holds 63549793 tokens"):
        check_plan(short)


def test_check_plan_refuses_a_window_only_rank_on_larger_pages() -> None:
    plan = _window_only_plan()
    plan["page_size"] = 2
    for pool in plan["pools"]:
        pool["block_tokens"] = 2
    with pytest.raises(PlanInvariantError, match="at page_size 2; expected 1"):
        check_plan(plan)


def test_pool_kwargs_of_a_window_only_rank_are_sglangs_window_pool() -> None:
    """SGLang builds SWAKVPool(size=full tokens 0, size_swa=the window tokens) on such a rank,
    its full layer ids empty."""
    kwargs = pool_kwargs(rank_plans(case(llama4(6), 2))[0])["kv"]
    assert kwargs == {
        "class": "SWAKVPool", "size": 0, "size_swa": 63_549_793, "page_size": 1,
        "dtype": "bfloat16", "head_num": 1, "head_dim": 128,
        "swa_attention_layer_ids": [0, 1, 2], "full_attention_layer_ids": [],
    }


def test_a_window_only_rank_binds_on_meta_pools() -> None:
    """The torch backend binds such a rank's window views on meta pools of its full size."""
    backend = pytest.importorskip("hisparse_plan.torch")
    plan = rank_plans(case(llama4(6), 2))[0]
    report = backend.meta_check(plan)
    # Three layers, K and V, of (63,549,793 + a padding row) x 128 bf16 elements each.
    assert report.device_bytes == 3 * 2 * 63_549_794 * 128 * 2
    assert report.allocations == 3


def self_draft(config: dict[str, Any], pp: int) -> PlanRequest:
    return case(config, pp, speculative_algorithm="EAGLE", speculative_draft_model_path="@model")


def test_a_window_only_rank_prices_the_draft_at_the_models_full_shape() -> None:
    """Llama-4 of 8 layers drafting with itself in four stages: ranks 0 and 2 keep window
    layers only, and SGLang prices the draft's 2 full and 6 window layers there at the window
    layers' 512 bytes, with no ratio: 2 x 512 + 2 x 512 + 6 x 512 = 5120 bytes a token. The
    last rank ([6, 8): a full layer) runs the draft worker."""
    plans = rank_plans(self_draft(llama4(8), 4))
    assert [p.budget.cell_size_bytes for p in plans] == [5120, 4403.200000000001] * 2
    assert {p.max_total_num_tokens for p in plans} == {19_064_938}
    last = plans[-1]
    assert (tokens(last, "draft_kv"), tokens(last, "draft_swa")) == (19_064_938, 15_251_950)
    assert decoder_layers(last, "draft_kv") == [3, 7]
    assert all(not any(p.name.startswith("draft") for p in plan.pools) for plan in plans[:-1])
    for plan in plans:
        check_plan(plan)


def test_gpt_oss_drafting_with_itself_over_a_window_only_first_rank() -> None:
    rank0, rank1 = rank_plans(self_draft(gpt_oss(3), 2))
    assert (rank0.budget.cell_size_bytes, rank1.budget.cell_size_bytes) == (1024, 1126.4)
    assert rank0.max_total_num_tokens == 86_658_809
    assert (tokens(rank1, "draft_kv"), tokens(rank1, "draft_swa")) == (86_658_809, 69_327_047)


def test_a_window_only_last_rank_cannot_run_a_window_draft() -> None:
    """Llama-4 of 6 layers in three stages: the last rank keeps layers 4 and 5, window layers.
    SGLang builds the draft's window-hybrid pool there with a full part of 0 tokens, yet the
    draft's full layer 3 writes at the all-window allocator's ids (up to 23,831,172)."""
    with pytest.raises(UnsupportedRequestError, match=r"rank 2.*holds no token") as info:
        rank_plans(self_draft(llama4(6), 3))
    assert info.value.field == "engine.speculative_draft_window_layers"


def test_a_window_only_rank_of_a_model_of_unlike_shapes_is_refused_with_a_draft() -> None:
    """Rank 0 keeps window layer 0 of 2 KV heads, the model's full layer 4: the draft's full
    layers' price there is not planned."""
    layers = {"model.layers.0.attn": {"kind": "sliding_window", "block_size": 16,
                                      "num_kv_heads": 2, "head_size": 8, "dtype": "bfloat16",
                                      "sliding_window": 16},
              "model.layers.1.attn": {"kind": "full_attention", "block_size": 16,
                                      "num_kv_heads": 4, "head_size": 8, "dtype": "bfloat16"},
              "model.layers.2.attn": {"kind": "sliding_window", "block_size": 16,
                                      "num_kv_heads": 2, "head_size": 8, "dtype": "bfloat16",
                                      "sliding_window": 16}}
    request = PlanRequest.model_validate({
        "layers": layers, "model": {"max_model_len": 64},
        "device": {"available_bytes": 1 << 30},
        "engine": {"name": "sglang", "context_length": 64, "pp_size": 2,
                   "speculative_algorithm": "EAGLE", "speculative_draft_num_layers": 1}})
    with pytest.raises(UnsupportedRequestError, match=r"model.layers.1.attn.*expected \(2, 8"):
        plan_sglang(request)
    engine = request.engine
    assert engine is not None
    without = request.model_copy(update={"engine": engine.model_copy(update={
        "speculative_algorithm": None, "speculative_draft_num_layers": None})})
    assert [p.name for p in plan_sglang(without).pools] == ["swa"]
