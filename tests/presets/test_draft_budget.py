"""Issue 36: a draft of its own shape against the budget, and its config read with the
target's bounds; check_plan's indexes bounded.

SGLang 0.5.23's own figures for a one-layer EAGLE draft with 32 KV heads beside Llama-3.1-8B
(8 KV heads) on a 64 MiB budget (references/sglang_cases/llama31_8b_eagle_wide_draft.json):

    PYTHONPATH=references/sglang_stubs:references /work/sglang/bin/python \\
        references/sglang_reference.py references/sglang_cases/llama31_8b_eagle_wide_draft.json

gives 496 tokens, a cell of 135,168 bytes (32 target layers and the draft's one at the
target's 4,096 bytes a token: DefaultPoolConfigurator prices the draft at the target's
per-layer size), and a draft worker pool `kv` of [497, 32, 128] bf16 K and V, 8,142,848 bytes:
the draft's own 32 heads. The pools pass the budget by the draft's excess."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hisparse_plan.adapters.sglang import report_for_case, request_from_server_args
from hisparse_plan.checking import check_plan
from hisparse_plan.errors import PlanError, PlanInvariantError
from hisparse_plan.targets.sglang import plan_sglang
from support import paths
from support.cli_support import Run
from support.sglang_cases import tiny_dump

REPO = paths.REPO
TARGET = REPO / "tests" / "hf_configs" / "llama-3.1-8b-instruct" / "config.json"
CASE = REPO / "references" / "sglang_cases" / "llama31_8b_eagle_wide_draft.json"
MIB = 2**20


def _case(path: Path = CASE) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(path.read_text())
    loaded["config"] = str(REPO / loaded["config"])
    return loaded


def _draft(**fields: Any) -> dict[str, Any]:
    draft: dict[str, Any] = json.loads(TARGET.read_text())
    draft.update({"architectures": ["LlamaForCausalLMEagle"], "num_hidden_layers": 1,
                  **fields})
    return draft


def _request(draft: dict[str, Any]) -> Any:
    case = _case()
    return request_from_server_args(case["config"], case["server_args"], case["memory"],
                                    draft_config=draft)


def test_sglang_figures_for_a_draft_of_its_own_shape() -> None:
    report = report_for_case(_case())
    assert "error" not in report, report.get("error")
    assert (report["max_total_num_tokens"], report["cell_size_bytes"],
            report["max_running_requests"], report["req_to_token"]["shape"]) == (
        496, 135168, 48, [49, 4108])
    draft = report["draft_pools"]
    assert [(entry["name"], entry["tokens"]) for entry in draft] == [("kv", 496)]
    shapes = {tuple(buffer["shape"]) for buffer in draft[0]["buffers"]}
    assert shapes == {(497, 32, 128)}
    assert {buffer["storage_nbytes"] for buffer in draft[0]["buffers"]} == {8142848}


def test_sglang_figures_for_a_narrower_draft_of_its_own_head_dim() -> None:
    """An EAGLE3 draft of 4 KV heads of 64 beside Llama-3.1-8B at TP 2, 256 MiB
    (llama31_8b_tp2_eagle3_narrow_draft.json; sglang_diff.py agrees field by field): priced at
    the target's 4 x 128 x 2 x 2 = 2,048 bytes, pooled at its own 2 x 64 heads a rank."""
    case = _case(CASE.parent / "llama31_8b_tp2_eagle3_narrow_draft.json")
    report = report_for_case(case)
    assert (report["max_total_num_tokens"], report["cell_size_bytes"]) == (3971, 33 * 2048)
    draft = report["draft_pools"][0]
    assert {tuple(buffer["shape"]) for buffer in draft["buffers"]} == {(3972, 2, 64)}
    assert {buffer["storage_nbytes"] for buffer in draft["buffers"]} == {3972 * 2 * 64 * 2 * 2}
    plan = plan_sglang(request_from_server_args(
        case["config"], case["server_args"], case["memory"], draft_config=case["draft_config"]))
    assert plan.speculative is not None
    assert (plan.speculative.draft_cell_size_bytes, plan.speculative.draft_beyond_budget_bytes
            ) == (2048, 0)
    assert not plan.warnings
    check_plan(plan)


def test_the_plan_states_what_the_draft_takes_past_the_budget() -> None:
    plan = plan_sglang(_request(_draft(num_key_value_heads=32)))
    spec = plan.speculative
    assert spec is not None
    # SGLang's price: the target's 8 heads x 128 x (K + V) x 2 bytes, one draft layer.
    assert spec.draft_cell_size_bytes == 8 * 128 * 2 * 2 == 4096
    # The draft's own pages: 32 heads, 496 tokens beside the padding page.
    own = 32 * 128 * 2 * 2
    assert spec.draft_beyond_budget_bytes == 496 * (own - 4096) == 6094848
    device = sum(pool.size * len(plan.allocation_layers(pool)) for pool in plan.pools)
    assert device == 32 * 497 * 4096 + 497 * own  # 69.9 MiB on a 64 MiB budget
    assert device > plan.budget.available_bytes == 64 * MIB
    padding = 32 * 4096 + own
    assert device - padding - spec.draft_beyond_budget_bytes <= plan.budget.available_bytes
    assert any("6094848" in note and str(64 * MIB) in note for note in plan.warnings)
    check_plan(plan)
    check_plan(plan, request=_request(_draft(num_key_value_heads=32)))


def test_a_draft_of_the_targets_shape_records_nothing() -> None:
    plan = plan_sglang(_request(_draft()))
    assert plan.speculative is not None
    assert plan.speculative.draft_beyond_budget_bytes == 0
    assert "draft_beyond_budget_bytes" not in plan.model_dump(mode="json")["speculative"]
    assert not plan.warnings


def test_check_plan_refuses_pools_past_the_budget_unrecorded() -> None:
    request = _request(_draft(num_key_value_heads=32))
    dumped = plan_sglang(request).model_dump(mode="json")
    dumped["speculative"].pop("draft_beyond_budget_bytes")
    for given in (None, request):
        with pytest.raises(PlanInvariantError, match="draft_beyond_budget_bytes"):
            check_plan(dumped, request=given)


def test_check_plan_refuses_an_inflated_draft_pool() -> None:
    """The issue's edit: a same-shape draft's pool given 4 times the heads' bytes a page."""
    dumped = plan_sglang(_request(_draft())).model_dump(mode="json")
    pool = next(pool for pool in dumped["pools"] if pool["name"] == "draft_kv")
    tensor = next(tensor for tensor in dumped["tensors"] if tensor["pool"] == "draft_kv")
    for part in tensor["ranges"]:
        part["offset"] *= 4
        part["size"] *= 4
    tensor["block_stride"] *= 4
    pool["size"] *= 4
    for view in tensor.get("views") or []:
        view["shape"][1] *= 4
        view["strides"][0] *= 4
    with pytest.raises(PlanInvariantError):
        check_plan(dumped)


DRAFTS_REFUSED = {
    "heads 10^9": {"num_key_value_heads": 10**9, "num_attention_heads": 10**9},
    "KV heads 10^9": {"num_key_value_heads": 10**9},
    "heads 0": {"num_key_value_heads": 0},
    "query heads 0": {"num_attention_heads": 0},
    "hidden 10^12": {"hidden_size": 10**12},
    "head_dim 10^9": {"head_dim": 10**9},
    "nested text_config": {"text_config": {"text_config": {"num_hidden_layers": 1}}},
    "list text_config": {"text_config": [1, 2]},
    "control character in model_type": {"model_type": "lla\x07ma"},
    "layers 10^9": {"num_hidden_layers": 10**9},
    "MTP layers 10^9": {"num_nextn_predict_layers": 10**9},
    "hidden a float": {"hidden_size": 4096.5},
}


@pytest.mark.parametrize("fields", DRAFTS_REFUSED.values(), ids=list(DRAFTS_REFUSED))
def test_the_draft_path_refuses_what_the_targets_reader_refuses(
    cli: Run, tmp_path: Path, fields: dict[str, Any]
) -> None:
    (tmp_path / "config.json").write_text(json.dumps(_draft(**fields)))
    code, out, err = cli("plan", "--hf-config", str(TARGET), "--engine", "sglang",
                         "--gpu-mem", "64MiB", "--speculative-algorithm", "EAGLE",
                         "--speculative-draft-model-path", str(tmp_path), "--json")
    assert (code, out) == (2, ""), err
    assert len(err.splitlines()) == 1, err
    assert err.startswith("error: "), err
    assert "internal error" not in err


@pytest.mark.parametrize("fields", DRAFTS_REFUSED.values(), ids=list(DRAFTS_REFUSED))
def test_the_adapter_refuses_the_same_drafts(fields: dict[str, Any]) -> None:
    with pytest.raises(PlanError):
        plan_sglang(_request(_draft(**fields)))


def test_check_plan_bounds_the_pipeline_rank_first() -> None:
    """A DeepSeek-V4 pipeline plan whose pp_rank is not below pp_size: a refusal, not the
    IndexError of reading stage_tokens[pp_rank]."""
    dumped = tiny_dump("deepseek_v4_pipeline_rank")
    dumped["pipeline"]["pp_rank"] = dumped["pipeline"]["pp_size"]
    with pytest.raises(PlanInvariantError, match="pp_rank"):
        check_plan(dumped)


def test_the_cli_refuses_that_plan_in_one_line(cli: Run, tmp_path: Path) -> None:
    dumped = tiny_dump("deepseek_v4_pipeline_rank")
    dumped["pipeline"]["pp_rank"] = 7
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(dumped))
    code, _, err = cli("transfer", str(path), str(path))
    assert code == 2, err
    assert len(err.splitlines()) == 1, err
    assert "internal error" not in err
