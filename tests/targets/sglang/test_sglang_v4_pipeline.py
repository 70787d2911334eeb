"""DeepSeek-V4 in SGLang pipeline stages (`pp_size`) against SGLang 0.5.23's own figures: each
rank sizes its V4 pools for its own layers (DSV4PoolConfigurator's stage slice), the ranks
take the fewest full tokens (the MIN all-reduce), and a rank keeps an empty pool for each
compression ratio of the model its layers lack. The figures are literals computed with SGLang's
own code by the reference harness (every rank configured, a process-group stub answering the
ranks' MIN all-reduce), SGLang not imported here:

    PYTHONPATH=$PWD/src python references/sglang_diff.py --dump --cases \
        references/sglang_cases/dsv4_flash_tp8_pp2.json \
        references/sglang_cases/dsv4_flash_tp8_pp2_hisparse.json

(and the other cases `case()` below builds, written to a file); the same command without
--dump compares every field of every rank: all agree."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hisparse_plan.adapters.sglang import rank_plans, report_for_case, request_from_server_args
from hisparse_plan.checking import check_plan
from hisparse_plan.errors import PlanInvariantError, UnsupportedRequestError
from hisparse_plan.models.request import PlanRequest
from hisparse_plan.models.sglang_plan import SGLangPlan
from hisparse_plan.targets.sglang import plan_sglang, plan_traced
from support.cli_support import Run

V4_CONFIG = Path("references/sglang_cases/deepseek_v4_flash_config.json")
GIB = 1 << 30
HISPARSE: dict[str, Any] = {"enable_hisparse": True,
                             "hisparse_config": {"top_k": 512, "device_buffer_size": 1024,
                                                 "host_to_device_ratio": 2}}


def case(layers: int | None, pp: int, memory: dict[str, int] | None = None,
         **server_args: Any) -> dict[str, Any]:
    """DeepSeek-V4-Flash at TP 8 (or its first `layers` layers: two window-only, then ratio 4
    and 128 alternately, as the harness draws them) in `pp` stages."""
    config = json.loads(V4_CONFIG.read_text())
    if layers is not None:
        ratios = [0, 0] + [(4, 128)[i % 2] for i in range(layers - 2)]
        config.update(num_hidden_layers=layers, compress_ratios=[*ratios, 0])
    return {"config": config,
            "server_args": {"tp_size": 8, "context_length": 8192, "mem_fraction_static": 0.85,
                            "pp_size": pp, **server_args},
            "memory": memory or {"available_bytes": 8 * GIB}}


CASES = Path("references/sglang_cases")
FLASH_PP2: dict[str, Any] = json.loads((CASES / "dsv4_flash_tp8_pp2.json").read_text())


def request_of(data: dict[str, Any], rank: int = 0) -> PlanRequest:
    """The case's request for pipeline rank `rank` (SGLang's server arguments name no rank:
    each rank's process learns its own)."""
    request = request_from_server_args(data["config"], data["server_args"], data["memory"])
    assert request.engine is not None
    return request.model_copy(
        update={"engine": request.engine.model_copy(update={"pp_rank": rank})})


def shapes(plan: SGLangPlan) -> dict[str, tuple[list[int], int, int, int]]:
    """Each pool's first view shape, its layer count and first and last layer id."""
    found = {}
    for tensor in plan.tensors:
        assert tensor.views is not None
        ids = sorted(int(name.split("layers.")[1].split(".")[0]) for name in tensor.layers)
        found[tensor.pool] = (list(tensor.views[0].shape), len(ids), ids[0], ids[-1])
    return found


# SGLang's figures (harness, see the module doc): both ranks' pools, by (shape, layers, first
# layer id, last layer id); tokens, requests and budget are the same on both ranks.
FLASH_PP2_RANKS = [
    {"v4_swa": ([10189, 149760], 21, 0, 20), "v4_c4": ([101893, 37440], 10, 2, 20),
     "v4_index_c4": ([101893, 8448], 10, 2, 20), "v4_state_c4": ([81516, 2048], 10, 2, 20),
     "v4_index_state_c4": ([81516, 512], 10, 2, 20),
     "v4_c128": ([102017, 1728], 9, 3, 19), "v4_state_c128": ([33152, 1024], 9, 3, 19)},
    {"v4_swa": ([10189, 149760], 22, 21, 42), "v4_c4": ([101893, 37440], 11, 22, 42),
     "v4_index_c4": ([101893, 8448], 11, 22, 42), "v4_state_c4": ([81516, 2048], 11, 22, 42),
     "v4_index_state_c4": ([81516, 512], 11, 22, 42),
     "v4_c128": ([102017, 1728], 11, 21, 41), "v4_state_c128": ([33152, 1024], 11, 21, 41)},
]


def test_flash_in_two_stages_matches_sglangs_own() -> None:
    """SGLang 0.5.23: 26,083,584 full tokens (2,608,128 window) on both ranks, 256 requests,
    97,612,482,969 bytes a rank; rank 1 (22 layers to rank 0's 21) holds the fewest tokens, so
    rank 0's pools are sized for rank 1's count."""
    plans = rank_plans(request_of(FLASH_PP2))
    for rank, (plan, want) in enumerate(zip(plans, FLASH_PP2_RANKS, strict=True)):
        v4, pipeline = plan.deepseek_v4, plan.pipeline
        assert v4 is not None
        assert pipeline is not None
        assert (plan.max_total_num_tokens, v4.swa_tokens) == (26_083_584, 2_608_128)
        assert (v4.c4_tokens, v4.c128_tokens, v4.c4_index_tokens) == (6_520_896, 203_778,
                                                                      6_520_896)
        assert plan.max_running_requests == 256
        assert plan.budget.available_bytes == 97_612_482_969
        assert list(plan.req_to_token.shape) == [257, 8196]
        assert (pipeline.pp_rank, pipeline.start_layer, list(pipeline.stage_layers)) == (
            rank, 21 * rank, [21, 22])
        assert shapes(plan) == want
        assert v4.empty_pools == []
        check_plan(plan, request=request_of(FLASH_PP2, rank))
    own = plans[0].pipeline.stage_tokens if plans[0].pipeline else []
    assert own[1] == min(own) == 26_083_584 < own[0]


def test_flash_with_hisparse_in_two_stages_matches_sglangs_own() -> None:
    """HiSparse (host_to_device_ratio 2) at 8 GiB a rank, SGLang 0.5.23: 2,463,232 full tokens,
    the c4 device pool 307,904 slots ([4815, 37440] a layer), the host pool 615,808 slots
    ([9622, 37440] a c4 layer of the rank), the window pool [963, 149760]."""
    data = json.loads((CASES / "dsv4_flash_tp8_pp2_hisparse.json").read_text())
    assert data == case(None, 2, **HISPARSE) | {"config": str(V4_CONFIG)}
    for rank, plan in enumerate(rank_plans(request_of(data))):
        v4, hisparse = plan.deepseek_v4, plan.hisparse
        assert v4 is not None
        assert hisparse is not None
        assert (plan.max_total_num_tokens, plan.max_running_requests) == (2_463_232, 256)
        assert (v4.swa_tokens, v4.c4_tokens, v4.c128_tokens) == (246_272, 307_904, 19_244)
        assert (v4.c4_index_tokens, hisparse.host_tokens) == (615_808, 615_808)
        found = shapes(plan)
        c4_layers = (10, 2, 20) if rank == 0 else (11, 22, 42)
        assert found["v4_c4"] == ([4815, 37440], *c4_layers)
        assert found["v4_hisparse_host"] == ([9622, 37440], *c4_layers)
        assert found["v4_swa"][0] == [963, 149760]
        assert found["v4_state_c4"][0] == [7708, 2048]
        assert found["v4_c128"][0] == [9750, 1728]
        check_plan(plan, request=request_of(data, rank))


def test_a_rank_without_a_ratio_keeps_its_pools_empty() -> None:
    """Four layers in four stages (ratios 0, 0, 4, 128), SGLang 0.5.23: every rank keeps the
    v4_c4, v4_index_c4 and v4_c128 pools of the model, with no buffer where its layer lacks
    the ratio (7,960,960, 7,960,960 and 248,780 slots); the compressor states only where the
    ratio is. 31,843,840 full tokens on every rank."""
    report = report_for_case(case(4, 4))
    assert report["max_total_num_tokens"] == 31_843_840
    pools = [{pool["name"]: (pool["tokens"], len(pool["buffers"])) for pool in stage["pools"]}
             for stage in report["stages"]]
    compressed = {"v4_c4": 7_960_960, "v4_index_c4": 7_960_960, "v4_c128": 248_780}
    window = {"v4_swa": (3_184_384, 1)}
    assert pools[0] == pools[1] == {**{n: (t, 0) for n, t in compressed.items()}, **window}
    assert pools[2] == {"v4_c4": (7_960_960, 1), "v4_index_c4": (7_960_960, 1),
                        "v4_c128": (248_780, 0), "v4_state_c4": (99_524, 1),
                        "v4_index_state_c4": (99_524, 1), **window}
    assert pools[3] == {"v4_c4": (7_960_960, 0), "v4_index_c4": (7_960_960, 0),
                        "v4_c128": (248_780, 1), "v4_state_c128": (33_152, 1), **window}
    plan = plan_sglang(request_of(case(4, 4), 0))
    assert plan.deepseek_v4 is not None
    assert plan.deepseek_v4.empty_pools == ["v4_c4", "v4_index_c4", "v4_c128"]


def test_hisparse_on_a_rank_without_ratio_4_layers_is_refused() -> None:
    """Six layers in three stages with HiSparse: rank 0 keeps layers 0 and 1 (window only),
    where SGLang's HiSparse coordinator fails on the empty c4 pool (AttributeError:
    'HiSparseC4DevicePool' object has no attribute 'bytes_per_page_padded'); every rank's
    plan is refused naming rank 0, as every rank needs the others' tokens."""
    data = case(6, 3, **HISPARSE)
    for rank in range(3):
        with pytest.raises(UnsupportedRequestError,
                           match=r"pipeline rank 0 keeps decoder layers \[0, 2\)") as info:
            plan_sglang(request_of(data, rank))
        assert info.value.field == "engine.enable_hisparse"
    # Two stages give both ranks a ratio-4 layer: planned.
    assert plan_sglang(request_of(case(6, 2, **HISPARSE), 0)).hisparse is not None


def test_nextn_stays_refused_in_stages() -> None:
    with pytest.raises(UnsupportedRequestError, match="speculative") as info:
        plan_sglang(request_of(case(4, 2, speculative_algorithm="NEXTN")))
    assert info.value.field == "engine.speculative_algorithm"


def _dump(layers: int, pp: int, rank: int) -> dict[str, Any]:
    return plan_sglang(request_of(case(layers, pp), rank)).model_dump(mode="json")


@pytest.mark.parametrize(
    ("layers", "rank", "edit", "match"),
    [
        (4, 0, lambda p: p.update(pipeline=None), "without pipeline stages"),
        (4, 0, lambda p: p["deepseek_v4"]["empty_pools"].append("v4_c4"), "each pool once"),
        (4, 0, lambda p: p["deepseek_v4"]["empty_pools"].remove("v4_index_c4"),
         "v4_c4 and v4_index_c4 together"),
        (4, 0, lambda p: p["deepseek_v4"].update(c128_tokens=0), "c128_tokens"),
        (6, 1, lambda p: p["deepseek_v4"]["empty_pools"].append("v4_c4"),
         "none of the plan's own pools"),
        (6, 1, lambda p: p["pipeline"]["stage_tokens"].__setitem__(0, 256), "exceeds the fewest"),
        (6, 0, lambda p: p["pipeline"]["stage_tokens"].__setitem__(0, 10**12),
         r"stage_tokens\[0\]"),
    ],
    ids=["empty_pools_without_stages", "empty_twice", "index_apart", "empty_c128_sized_0",
         "held_and_empty", "more_than_the_fewest", "more_than_the_budget"],
)
def test_check_plan_refuses_a_broken_v4_rank(
    layers: int, rank: int, edit: Any, match: str
) -> None:
    plan = _dump(layers, 2, rank)
    check_plan(plan)
    edit(plan)
    with pytest.raises(PlanInvariantError, match=match):
        check_plan(plan)


def test_check_plan_proves_a_v4_rank_against_its_own_request_only() -> None:
    plans = rank_plans(request_of(case(6, 2)))
    check_plan(plans[1], request=request_of(case(6, 2), 1))
    with pytest.raises(PlanInvariantError):
        check_plan(plans[0], request=request_of(case(6, 2), 1))


def test_explain_names_the_stage_and_the_agreed_tokens() -> None:
    words = " ".join(str(entry) for entry in plan_traced(request_of(FLASH_PP2, 0)).trace.decisions)
    assert "pipeline rank 0 of 2" in words
    assert "layers [0, 21)" in words
    assert "MIN all-reduce" in words


def test_cli_plans_a_v4_rank(cli: Run) -> None:
    code, out, err = cli("plan", "deepseek-v4-flash", "--engine", "sglang", "--gpu", "h200",
                         "--pp-size", "2", "--pp-rank", "1", "--json")
    assert (code, err) == (0, ""), err
    plan = SGLangPlan.model_validate_json(out)
    assert plan.pipeline is not None
    assert (plan.pipeline.pp_rank, plan.pipeline.start_layer) == (1, 21)
    assert plan.max_total_num_tokens == min(plan.pipeline.stage_tokens)
    code, out, err = cli("explain", "deepseek-v4-flash", "--engine", "sglang", "--gpu", "h200",
                         "--pp-size", "2", "--pp-rank", "1")
    assert (code, err) == (0, ""), err
    assert "pipeline rank 1 of 2" in out
