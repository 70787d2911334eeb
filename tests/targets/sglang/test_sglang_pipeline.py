"""SGLang pipeline parallelism (`pp_size`) against SGLang 0.5.23's own figures: each rank's
layers, pools and tokens as SGLang's KVCacheConfigurator sizes them on that rank, the ranks
agreeing on the fewest tokens. The figures are literals, computed with SGLang's own code by
the reference harness (every rank configured, a process-group stub answering the ranks' MIN
all-reduce), SGLang not imported here:

    PYTHONPATH=references/sglang_stubs:references /work/sglang/bin/python \\
        references/sglang_reference.py CASES.json

with CASES.json the `CASES` below as `{"name", "config", "server_args", "memory"[, "gpu"]}`
(`python references/sglang_diff.py --cases ...` compares them field by field: all agree)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from hisparse_plan.adapters.sglang import (
    pool_kwargs,
    rank_plans,
    report,
    report_for_case,
    request_from_server_args,
)
from hisparse_plan.checking import check_plan
from hisparse_plan.errors import PlanError, PlanInvariantError, UnsupportedRequestError
from hisparse_plan.models.request import PlanRequest
from hisparse_plan.models.sglang_plan import SGLangPlan
from hisparse_plan.models.sglang_settings import SGLangSettings
from hisparse_plan.targets.sglang import plan_sglang, plan_traced
from support.cli_support import Run

H200_FREE = 149_250_113_536
LLAMA = "tests/hf_configs/llama-3.1-8b-instruct/config.json"
QWEN35 = "tests/hf_configs/qwen3.5-35b-a3b/config.json"

CASES: dict[str, dict[str, Any]] = {
    "llama8b_pp2": {
        "config": LLAMA,
        "server_args": {"tp_size": 1, "pp_size": 2, "context_length": 8192,
                        "mem_fraction_static": 0.88},
        "memory": {"pre_model_load_free_bytes": H200_FREE,
                   "post_weights_free_bytes": 140_660_178_944},
    },
    "qwen35_pp2": {
        "config": QWEN35,
        "server_args": {"tp_size": 2, "pp_size": 2, "context_length": 8192,
                        "mem_fraction_static": 0.88},
        "memory": {"pre_model_load_free_bytes": H200_FREE,
                   "post_weights_free_bytes": 131_533_373_440},
    },
    "qwen35_pp3": {
        "config": QWEN35,
        "server_args": {"tp_size": 2, "pp_size": 3, "context_length": 8192,
                        "mem_fraction_static": 0.88},
        "memory": {"pre_model_load_free_bytes": H200_FREE,
                   "post_weights_free_bytes": 131_533_373_440},
    },
    "llama8b_pp2_h200_default": {
        "config": LLAMA,
        "server_args": {"tp_size": 1, "pp_size": 2, "context_length": 8192},
        "gpu": {"total_memory_bytes": 150_754_820_096, "name": "NVIDIA H200"},
        "memory": {"pre_model_load_free_bytes": 148_607_238_144,
                   "post_weights_free_bytes": 140_017_303_552},
    },
}

# SGLang's figures, rank by rank: (layers [start, end), cell size, the kv buffer's shape,
# its layer ids first and last, the Mamba conv buffer's shape or None).
SGLANG: dict[str, dict[str, Any]] = {
    "llama8b_pp2": {
        "tokens": 1_873_018, "requests": 4096, "available": 122_750_165_319, "fraction": 0.88,
        "ranks": [((0, 16), 65536, [1_873_019, 8, 128], (0, 15), None),
                  ((16, 32), 65536, [1_873_019, 8, 128], (16, 31), None)],
    },
    "qwen35_pp2": {
        "tokens": 11_670_622, "requests": 834, "available": 59_753_587_015, "fraction": 0.88,
        "ranks": [((0, 20), 5120, [11_670_623, 1, 256], (3, 19), [15, 3340, 4096, 3]),
                  ((20, 40), 5120, [11_670_623, 1, 256], (23, 39), [15, 3340, 4096, 3])],
    },
    "qwen35_pp3": {
        "tokens": 14_588_278, "requests": 1252, "available": 59_753_587_015, "fraction": 0.88,
        "ranks": [((0, 13), 3072, [14_588_279, 1, 256], (3, 11), [10, 5010, 4096, 3]),
                  ((13, 26), 3072, [14_588_279, 1, 256], (15, 23), [10, 5010, 4096, 3]),
                  ((26, 40), 4096, [14_588_279, 1, 256], (27, 39), [10, 5010, 4096, 3])],
    },
    "llama8b_pp2_h200_default": {
        "tokens": 1_923_343, "requests": 4096, "available": 126_048_223_166, "fraction": 0.906,
        "ranks": [((0, 16), 65536, [1_923_344, 8, 128], (0, 15), None),
                  ((16, 32), 65536, [1_923_344, 8, 128], (16, 31), None)],
    },
}


def case_request(name: str, **server_args: Any) -> PlanRequest:
    case = CASES[name]
    return request_from_server_args(case["config"], {**case["server_args"], **server_args},
                                    case["memory"], gpu=case.get("gpu"))


def layer_index(name: str) -> int:
    found = re.search(r"layers\.(\d+)\.", name)
    assert found is not None, name
    return int(found.group(1))


def view_shape(plan: SGLangPlan, pool: str) -> list[int]:
    tensor = next(t for t in plan.tensors if t.pool == pool)
    assert tensor.views is not None
    return list(tensor.views[0].shape)


@pytest.mark.parametrize("name", sorted(SGLANG))
def test_every_rank_matches_sglangs_own(name: str) -> None:
    want = SGLANG[name]
    plans = rank_plans(case_request(name))
    assert len(plans) == len(want["ranks"])
    for rank, (plan, figures) in enumerate(zip(plans, want["ranks"], strict=True)):
        (start, end), cell, kv_shape, (first, last), conv = figures
        assert plan.max_total_num_tokens == want["tokens"]
        assert plan.max_running_requests == want["requests"]
        assert plan.budget.available_bytes == want["available"]
        assert plan.budget.mem_fraction_static == want["fraction"]
        assert plan.budget.cell_size_bytes == cell
        assert plan.pipeline is not None
        assert plan.pipeline.pp_rank == rank
        assert plan.pipeline.start_layer == start
        assert start + plan.pipeline.stage_layers[rank] == end
        assert view_shape(plan, "kv") == kv_shape
        ids = sorted({layer_index(n) for t in plan.tensors if t.pool == "kv" for n in t.layers})
        assert (ids[0], ids[-1]) == (first, last)
        assert all(start <= layer_index(n) < end for t in plan.tensors for n in t.layers)
        assert (view_shape(plan, "mamba_conv0") if conv else None) == conv
        check_plan(plan)


def test_the_ranks_take_the_fewest_tokens() -> None:
    """Qwen3.5 in three stages: the last rank has 14 layers (4 full attention) to the others'
    13 (3), so its 4096-byte cell holds the fewest tokens and every rank takes them; every
    rank charges the same Mamba slots (10 Mamba layers each), 4 a request without the overlap
    scheduler."""
    plans = rank_plans(case_request("qwen35_pp3"))
    own = [plan.pipeline.stage_tokens for plan in plans if plan.pipeline is not None]
    assert own[0] == own[1] == own[2]
    tokens = own[0]
    assert tokens[2] == min(tokens) == SGLANG["qwen35_pp3"]["tokens"] < tokens[0] == tokens[1]
    assert all(plan.budget.mamba_slots_per_request == 4 for plan in plans)
    assert all(plan.pipeline is not None and plan.pipeline.mamba_stage_layers == 10
               for plan in plans)


def test_one_stage_keeps_its_figures() -> None:
    """pp_size 1 plans as before: no pipeline section, 5 Mamba slots a request."""
    plan = plan_sglang(case_request("qwen35_pp2", pp_size=1))
    assert plan.pipeline is None
    assert plan.budget.mamba_slots_per_request == 5


def test_check_plan_proves_a_rank_against_its_request() -> None:
    request = case_request("llama8b_pp2")
    assert request.engine is not None
    ranked = request.model_copy(
        update={"engine": request.engine.model_copy(update={"pp_rank": 1})})
    plans = rank_plans(request)
    check_plan(plans[1], request=ranked)
    with pytest.raises(PlanInvariantError, match="layers"):
        check_plan(plans[0], request=ranked)


def _edited(plan: SGLangPlan, **pipeline: Any) -> dict[str, Any]:
    data = plan.model_dump(mode="json")
    data["pipeline"].update(pipeline)
    return data


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        ({"stage_layers": [17, 15]}, "even split"),
        ({"stage_layers": [15, 16, 1]}, "lists 3 ranks"),
        ({"start_layer": 15}, "expected 16"),
        ({"stage_tokens": [2_000_000, 1_873_017]}, "exceeds the fewest"),
        ({"stage_tokens": [2_000_000, 1_873_010]}, "exceeds the fewest"),
        ({"pp_rank": 2}, "below pp_size"),
        ({"mamba_stage_layers": 3}, "Mamba pools"),
    ],
)
def test_check_plan_refuses_a_broken_pipeline(edit: dict[str, Any], match: str) -> None:
    plan = rank_plans(case_request("llama8b_pp2"))[1]
    with pytest.raises(PlanInvariantError, match=match):
        check_plan(_edited(plan, **edit))


def test_check_plan_refuses_a_rank_figure_its_budget_does_not_give() -> None:
    """Rank 0's own tokens are the whole pages its budget holds at its cell size: one more
    token is more than the budget holds."""
    plan = rank_plans(case_request("llama8b_pp2"))[0]
    assert plan.pipeline is not None
    stage = list(plan.pipeline.stage_tokens)
    with pytest.raises(PlanInvariantError, match="stage_tokens\\[0\\]"):
        check_plan(_edited(plan, stage_tokens=[stage[0] + 1, stage[1]]))


def test_check_plan_refuses_a_layer_outside_the_rank() -> None:
    """Rank 1's layers (16 to 31) in a plan that claims to be rank 0's."""
    plan = rank_plans(case_request("llama8b_pp2"))[1]
    with pytest.raises(PlanInvariantError, match=r"layers\.16\..* rank 0's decoder layers"):
        check_plan(_edited(plan, start_layer=0, stage_layers=[16, 16], pp_rank=0))


@pytest.mark.parametrize(
    ("config", "server_args", "error", "field"),
    [
        (LLAMA, {"pp_size": 33}, PlanError, "engine.pp_size"),
        ("tests/hf_configs/qwen3-next-80b-a3b-instruct/config.json", {"pp_size": 2},
         UnsupportedRequestError, "engine.pp_size"),
        ("tests/hf_configs/gemma-2-9b-it/config.json", {"pp_size": 2},
         UnsupportedRequestError, "engine.pp_size"),
    ],
)
def test_refuses_what_sglang_does_not_split(
    config: str, server_args: dict[str, Any], error: type[Exception], field: str
) -> None:
    request = request_from_server_args(config, {"context_length": 4096, **server_args},
                                       {"available_bytes": 8 << 30})
    with pytest.raises(error) as info:
        plan_sglang(request)
    assert getattr(info.value, "field", None) == field


def test_pp_rank_beyond_the_stages_is_refused() -> None:
    with pytest.raises(ValidationError, match=r"engine\.pp_rank"):
        SGLangSettings.model_validate(
            {"name": "sglang", "context_length": 4096, "pp_size": 2, "pp_rank": 2})


def test_vllms_pipeline_stages_stay_refused() -> None:
    data = case_request("llama8b_pp2", pp_size=1).model_dump(mode="json")
    data["device"]["pipeline_stages"] = [{"layers": list(data["layers"]), "available_bytes": 1}]
    with pytest.raises(UnsupportedRequestError, match=r"engine\.pp_size") as info:
        plan_sglang(data)
    assert info.value.field == "device.pipeline_stages"


def test_cli_plans_one_rank(cli: Run) -> None:
    """`--pp-size 2 --pp-rank 1`: the second rank's layers, every rank's tokens agreed, half
    the weights a rank, and SGLang's default fraction for two stages (0.906 on an H200)."""
    code, out, err = cli("plan", "--hf-config", LLAMA, "--engine", "sglang", "--gpu", "h200",
                         "--pp-size", "2", "--pp-rank", "1", "--context-length", "8192",
                         "--json")
    assert (code, err) == (0, ""), err
    plan = SGLangPlan.model_validate_json(out)
    assert plan.pipeline is not None
    assert (plan.pipeline.pp_rank, plan.pipeline.start_layer) == (1, 16)
    assert plan.budget.mem_fraction_static == 0.906
    assert plan.max_total_num_tokens == min(plan.pipeline.stage_tokens)
    code, _, err = cli("plan", "--hf-config", LLAMA, "--engine", "sglang", "--gpu", "h200",
                       "--pp-size", "2", "--pp-rank", "2")
    assert code != 0
    assert "--pp-rank" in err


def test_pool_kwargs_and_explain_name_the_rank() -> None:
    """SGLang's pool class takes the rank's layer range; `explain` says the ranks agreed."""
    request = case_request("llama8b_pp2")
    assert request.engine is not None
    ranked = request.model_copy(
        update={"engine": request.engine.model_copy(update={"pp_rank": 1})})
    kwargs = pool_kwargs(rank_plans(request)[1])["kv"]
    assert (kwargs["class"], kwargs["layer_num"]) == ("MHATokenToKVPool", 16)
    assert (kwargs["start_layer"], kwargs["end_layer"]) == (16, 32)
    words = " ".join(str(entry) for entry in plan_traced(ranked).trace.decisions)
    assert "pipeline rank 1 of 2" in words
    assert "MIN all-reduce" in words


def _qwen35_four_layers_in_three_stages() -> PlanRequest:
    config = json.loads(Path(QWEN35).read_text())
    config["text_config"]["num_hidden_layers"] = 4
    config["text_config"]["layer_types"] = ["linear_attention"] * 3 + ["full_attention"]
    return request_from_server_args(config, {"pp_size": 3, "context_length": 2048},
                                    {"available_bytes": 8 << 30})


def test_a_rank_of_mamba_layers_only_offers_int64s_largest_count() -> None:
    """Qwen3.5 cut to 4 layers in 3 stages: ranks 0 and 1 keep one linear-attention layer
    each. SGLang sizes no KV there (cell 0) and such a rank offers int64's largest count to
    the MIN (DefaultPoolConfigurator._zero_kv_max_tokens, KV on another stage), so rank 2's
    2,181,248 tokens are every rank's; SGLang's KV pool object on ranks 0 and 1 has no layer.
    Figures from SGLang's own code (sglang_diff --dump of this case): 467 requests, 1871 Mamba
    slots, budget 4,467,195,904 bytes."""
    plans = rank_plans(_qwen35_four_layers_in_three_stages())
    for plan in plans:
        assert plan.max_total_num_tokens == 2_181_248
        assert plan.max_running_requests == 467
        assert plan.budget.available_bytes == 4_467_195_904
        assert view_shape(plan, "mamba_conv0") == [1, 1872, 8192, 3]
        check_plan(plan)
    assert [plan.budget.cell_size_bytes for plan in plans] == [0, 0, 2048]
    assert [sorted(p.name for p in plan.pools) for plan in plans[:2]] == [
        ["mamba_conv0", "mamba_temporal"]] * 2
    assert plans[0].pipeline is not None
    assert plans[0].pipeline.stage_tokens[:2] == [2**63 - 1] * 2
    assert report(plans[0])["pools"][0] == {
        "name": "kv", "location": "device", "tokens": 2_181_248, "buffers": []}


def test_check_plan_holds_a_mamba_only_rank_to_its_rule() -> None:
    """The checker's own arithmetic: a rank without KV layers has cell 0 and offers int64's
    largest count; a cell above 0 there, another offer, or cell 0 without stages is refused."""
    plan = rank_plans(_qwen35_four_layers_in_three_stages())[0].model_dump(mode="json")
    cell = {**plan, "budget": {**plan["budget"], "cell_size_bytes": 1}}
    with pytest.raises(PlanInvariantError, match="cell_size_bytes is 1"):
        check_plan(cell)
    offer = _edited(SGLangPlan.model_validate(plan),
                    stage_tokens=[2**62, 2**63 - 1, 2_181_248])
    with pytest.raises(PlanInvariantError, match=r"stage_tokens\[0\] is 4611686018427387904"):
        check_plan(offer)
    alone = {**plan, "pipeline": None}
    with pytest.raises(PlanInvariantError, match="no pool 'kv'"):
        check_plan(alone)


def _hybrid_104_3() -> dict[str, Any]:
    """sglang_diff seed 104 case 3 on an H200 (SM90): Qwen3.5 cut to 4 layers in 4 stages,
    the radix cache off, SGLang's default fraction; rank 3 keeps only the full-attention
    layer."""
    config = json.loads(Path(QWEN35).read_text())
    config["text_config"]["num_hidden_layers"] = 4
    config["text_config"]["layer_types"] = ["linear_attention"] * 3 + ["full_attention"]
    return {"config": config,
            "server_args": {"tp_size": 4, "context_length": 2048, "disable_radix_cache": True,
                            "pp_size": 4},
            "memory": {"pre_model_load_free_bytes": 190_118_363_136,
                       "post_weights_free_bytes": 181_528_428_544},
            "gpu": {"total_memory_bytes": 192_265_846_784, "name": "NVIDIA B200",
                    "capability": [9, 0]}}


def _empty_state(name: str, view: str, dtype: str, state: list[int],
                 strides: list[int]) -> dict[str, Any]:
    return {"name": name, "location": "device", "tokens": 123_629, "buffers": [{
        "layer": None, "name": view, "dtype": dtype, "shape": [0, 123_630, *state],
        "strides": strides, "storage_offset": 0, "storage_nbytes": 0,
        "storage": f"{name}/0"}]}


def test_a_rank_without_the_hybrids_mamba_layers_keeps_empty_mamba_pools() -> None:
    """hybrid-104-3 as SGLang 0.5.23 builds it (sglang_diff --dump): every rank charges the
    largest stage's Mamba slots (one layer's, _handle_max_mamba_cache), so all keep 123,629
    slots; rank 3, with none of the 3 Mamba layers, builds its Mamba pools over no layer
    (buffers [0, 123630, ...], no byte) beside its KV pool of 71,980,219 tokens (cell 1,024),
    which the Mamba-only ranks 0-2 take from the MIN; 4,096 requests."""
    got = report_for_case(_hybrid_104_3())
    assert "error" not in got, got.get("error")
    assert (got["max_total_num_tokens"], got["max_running_requests"],
            got["available_bytes"]) == (71_980_219, 4096, 73_707_745_093)
    assert [stage["cell_size_bytes"] for stage in got["stages"]] == [0, 0, 0, 1024]
    last = got["stages"][3]["pools"]
    assert [pool["name"] for pool in last] == ["kv", "mamba_conv0", "mamba_temporal"]
    assert last[0]["buffers"][0]["shape"] == [71_980_220, 1, 256]
    assert last[1:] == [
        _empty_state("mamba_conv0", "conv[0]", "bfloat16", [2048, 3],
                     [759_582_720, 6144, 3, 1]),
        _empty_state("mamba_temporal", "temporal", "float32", [8, 128, 128],
                     [16_204_431_360, 131_072, 16_384, 128, 1])]
    assert [pool["tokens"] for pool in got["stages"][0]["pools"]] == [71_980_219, 123_629,
                                                                     123_629]


def _rank_without_mamba() -> SGLangPlan:
    case = _hybrid_104_3()
    request = request_from_server_args(case["config"], case["server_args"], case["memory"],
                                       gpu=case["gpu"])
    plans = rank_plans(request)
    for plan in plans:
        check_plan(plan)
    return plans[3]


def test_check_plan_holds_the_empty_mamba_pools_to_their_slots() -> None:
    """The checker's own arithmetic on rank 3's empty Mamba pools: one slot count, buffers of
    no layer, the slots bounding the running requests; pools it does not name are refused."""
    plan = _rank_without_mamba()
    assert plan.pipeline is not None
    assert plan.budget.mamba_slots_per_request == 1
    assert [pool.name for pool in plan.pools] == ["kv"]
    data = plan.model_dump(mode="json")

    def edited(index: int, **change: Any) -> dict[str, Any]:
        copy: dict[str, Any] = json.loads(json.dumps(data))
        entry = copy["pipeline"]["empty_mamba_pools"][index]
        for key, value in change.items():
            (entry["view"] if key in ("shape", "strides") else entry)[key] = value
        return copy

    with pytest.raises(PlanInvariantError, match=r"empty_mamba_pools\[1\]"):
        check_plan(edited(1, slots=123_628))
    with pytest.raises(PlanInvariantError, match=r"empty_mamba_pools\[0\]"):
        check_plan(edited(0, shape=[1, 123_630, 2048, 3]))
    swapped = json.loads(json.dumps(data))
    swapped["pipeline"]["empty_mamba_pools"].reverse()
    with pytest.raises(PlanInvariantError, match="expected \\['mamba_conv0', 'mamba_temporal'"):
        check_plan(swapped)
    few = edited(0, slots=4000, shape=[0, 4001, 2048, 3], strides=[4001 * 6144, 6144, 3, 1])
    few["pipeline"]["empty_mamba_pools"][1].update(slots=4000)
    few["pipeline"]["empty_mamba_pools"][1]["view"]["shape"][1] = 4001
    few["pipeline"]["empty_mamba_pools"][1]["view"]["strides"][0] = 4001 * 131072
    with pytest.raises(PlanInvariantError, match="needs 4096 Mamba state slots"):
        check_plan(few)
    none = json.loads(json.dumps(data))
    none["pipeline"]["empty_mamba_pools"] = []
    with pytest.raises(PlanInvariantError, match="mamba_slots_per_request is 1"):
        check_plan(none)


def test_only_the_last_rank_runs_the_draft_worker() -> None:
    # SGLang's EAGLEWorkerV2 builds its draft worker where pp_group.is_last_rank; every rank
    # prices the draft's layers in its cell, so the ranks agree on their tokens.
    # sglang_diff.py seeds 101/102 drew such cases (e.g. mha-101-48): SGLang's report puts the
    # draft pools beside the last rank only.
    draft = {"speculative_algorithm": "EAGLE", "speculative_draft_model_path": "@model"}
    request = case_request("llama8b_pp2", **draft)
    first, last = rank_plans(request)
    assert not [pool.name for pool in first.pools if pool.name.startswith("draft_")]
    assert [pool.name for pool in last.pools if pool.name.startswith("draft_")] == ["draft_kv"]
    assert first.speculative is not None
    assert last.speculative is not None
    assert first.budget.cell_size_bytes == last.budget.cell_size_bytes
    for plan in (first, last):
        check_plan(plan)
    moved = last.model_dump(mode="json")
    moved["pipeline"]["pp_rank"], moved["pipeline"]["start_layer"] = 0, 0
    for tensor in moved["tensors"]:
        if not tensor["pool"].startswith("draft_"):
            tensor["layers"] = [name.replace(f"layers.{layer_index(name)}.",
                                             f"layers.{layer_index(name) - 16}.")
                                for name in tensor["layers"]]
    with pytest.raises(PlanInvariantError, match="only the last rank runs the draft worker"):
        check_plan(moved)


def test_a_window_pool_capped_for_requests_under_stages_and_speculative_decoding() -> None:
    # references/sglang_cases/swa_pp4_eagle3_radix_off.json (sglang_diff.py seed 103, case
    # swa-103-81): pipeline stages turn SGLang's overlap scheduler off, so a request's window
    # cap holds one non-overlap decode step (spec_decode_alloc_len_per_request), not two
    # overlapped ones. SGLang's own figure: 61,359,148 tokens (we planned 61,359,020).
    case = json.loads(Path("references/sglang_cases/swa_pp4_eagle3_radix_off.json").read_text())
    report = report_for_case(case)
    assert "error" not in report, report.get("error")
    assert report["max_total_num_tokens"] == 61_359_148


def test_drafting_on_a_rank_without_mamba_layers_is_refused_by_name() -> None:
    """With speculative decoding, SGLang's MambaPool on rank 3 also keeps the draft tokens'
    intermediate states over no layer (memory_pool.py: [num_mamba_layers, slots, ...]), which
    the plan does not record: refused naming the setting, not planned without them."""
    case = _hybrid_104_3()
    case["server_args"].update(speculative_algorithm="EAGLE", speculative_draft_model_path="@model")
    error = report_for_case(case)["error"]
    assert "engine.speculative_algorithm: pipeline rank 3 of 4 keeps none" in error
