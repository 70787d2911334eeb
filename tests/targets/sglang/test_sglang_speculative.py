"""SGLang 0.5.23's speculative decoding (NEXTN / EAGLE / EAGLE3), pinned to figures SGLang's
own code computed, and check_plan's proof of the draft worker's pools.

Every pinned figure came from SGLang's own classes on the meta device, the target's pools by
`KVCacheConfigurator.configure` and the draft worker's by a second
`KVCacheConfigurator(is_draft_worker=True)` handed the target's memory_pool_config,
req_to_token_pool and allocator, as `EAGLEWorkerV2.alloc_memory_pool` does:

    PYTHONPATH=references/sglang_stubs:references /work/sglang/bin/python \\
        references/sglang_reference.py references/sglang_cases/dsv32_tp8_dp8_h200.json \\
        references/sglang_cases/dsv32_tp8_dp8_mtp_h200.json \\
        references/sglang_cases/dsv32_tp8_dp8_b200.json \\
        references/sglang_cases/dsv32_tp8_dp8_mtp_b200.json \\
        references/sglang_cases/qwen3next_tp4_eagle.json \\
        references/sglang_cases/gptoss120b_tp8_eagle3.json \\
        references/sglang_cases/dsv32_tp8_hisparse_mtp.json \\
        references/sglang_cases/dsv32_tp8_dcp2_mtp.json \\
        references/sglang_cases/gptoss120b_tp8_eagle3_radix_off.json

and the whole reports (every buffer's shape, strides and bytes, the draft's pools included)
agree with ours field by field:

    python references/sglang_diff.py --cases references/sglang_cases/dsv32_tp8_dp8_*.json \\
        references/sglang_cases/qwen3next_tp4_eagle.json \\
        references/sglang_cases/gptoss120b_tp8_eagle3*.json \\
        references/sglang_cases/dsv32_tp8_hisparse_mtp.json \\
        references/sglang_cases/dsv32_tp8_dcp2_mtp.json
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from hisparse_plan.adapters.sglang import report_for_case, request_from_server_args
from hisparse_plan.checking import check_plan
from hisparse_plan.errors import PlanError, PlanInvariantError, UnsupportedRequestError
from hisparse_plan.models.sglang_plan import SGLangPlan
from hisparse_plan.targets.sglang import plan_sglang, plan_traced
from support import paths
from support.cli_support import Run

REPO = paths.REPO
CASES = REPO / "references" / "sglang_cases"


def case(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((CASES / f"{name}.json").read_text())
    loaded["config"] = str(REPO / loaded["config"])
    return loaded


def plan_of(name: str, **server_args: Any) -> SGLangPlan:
    found = case(name)
    found["server_args"].update(server_args)
    return plan_sglang(request_from_server_args(
        found["config"], found["server_args"], found["memory"], gpu=found.get("gpu"),
        draft_config=found.get("draft_config")))


def pool_bytes(entry: dict[str, Any]) -> int:
    """An entry's allocations, each counted once."""
    storages = {buffer["storage"]: buffer["storage_nbytes"] for buffer in entry["buffers"]}
    return sum(storages.values())


# (case, tokens, cell bytes, running requests, request table, {draft pool: (tokens, bytes)})
PINNED = [
    ("dsv32_tp8_dp8_h200", 347648, 78324, 2048, [2049, 163844], {}),
    ("dsv32_tp8_dp8_mtp_h200", 342016, 79608, 6, [7, 163911],
     {"kv": (342016, 394076160), "index": (342016, 45154560)}),
    ("dsv32_tp8_dp8_b200", 1182336, 43188, 3694, [3695, 163844], {}),
    ("dsv32_tp8_dp8_mtp_b200", 1163264, 43896, 6, [7, 163911],
     {"kv": (1163264, 670076928), "index": (1163264, 153559296)}),
    ("qwen3next_tp4_eagle", 4244226, 13312, 48, [49, 8200], {"kv": (4244226, 4346088448)}),
    ("gptoss120b_tp8_eagle3", 13706834, 8550.4, 48, [49, 8200],
     {"kv": (13706834, 3508949760)}),
    # HiSparse: the draft pool spans the allocator's logical ids (2 x the device tokens).
    ("dsv32_tp8_hisparse_mtp", 839296, 57696, 48, [49, 8263],
     {"kv": (1678592, 1101198336), "index": (1678592, 221582592)}),
    # Decode context parallelism 2: the replicated draft pages both ranks' ids (128 a page).
    ("dsv32_tp8_dcp2_mtp", 839296, 57696, 48, [49, 8327],
     {"kv": (1678592, 1101240320), "index": (1678592, 221591040)}),
    # Radix cache off: the window pool capped for 64 // 2 requests with draft tokens.
    ("gptoss120b_tp8_eagle3_radix_off", 12024030, 17100.8, 32, [33, 8200],
     {"kv": (12024030, 6156303872)}),
]


@pytest.mark.parametrize(("name", "tokens", "cell", "requests", "table", "draft"), PINNED,
                         ids=[row[0] for row in PINNED])
def test_figures_sglang_computed(
    name: str, tokens: int, cell: float, requests: int, table: list[int],
    draft: dict[str, tuple[int, int]],
) -> None:
    report = report_for_case(case(name))
    assert "error" not in report, report.get("error")
    got = (report["max_total_num_tokens"], report["cell_size_bytes"],
           report["max_running_requests"], report["req_to_token"]["shape"])
    assert got == (tokens, cell, requests, table)
    drafted = {entry["name"]: (entry["tokens"], pool_bytes(entry))
               for entry in report.get("draft_pools", [])}
    assert drafted == draft


def test_deepseek_v32_mtp_draft_inside_the_budget() -> None:
    """MTP takes the draft layer's bytes out of the same budget: the same KV budget holds
    fewer target tokens, and the target's pools and the draft's together fit in it."""
    plain, mtp = plan_of("dsv32_tp8_dp8_h200"), plan_of("dsv32_tp8_dp8_mtp_h200")
    assert plain.budget.available_bytes == mtp.budget.available_bytes == 27232240140
    assert (plain.budget.cell_size_bytes, mtp.budget.cell_size_bytes) == (78324, 79608)
    spec = mtp.speculative
    assert spec is not None
    assert plain.speculative is None
    assert (spec.algorithm, spec.num_steps, spec.eagle_topk, spec.num_draft_tokens) == (
        "EAGLE", 3, 1, 4)
    assert spec.draft_layers == ["draft.layers.0"]
    # 1,152 latent bytes + a 132-byte index key, one draft layer.
    assert spec.draft_cell_size_bytes == 1284
    device = sum(pool.size * len(mtp.allocation_layers(pool)) for pool in mtp.pools)
    padding = sum(tensor.block_stride * len(tensor.layers) for tensor in mtp.tensors)
    # Every pool's padding page (SGLang's page 0) comes on top of the budget, as without MTP.
    assert device - padding <= mtp.budget.available_bytes < device
    draft = sum(pool.size for pool in mtp.pools if pool.name.startswith("draft_"))
    assert draft == 394076160 + 45154560


def test_issue_draft_pool_arithmetic() -> None:
    """The issue's DeepSeek-V3.2 figure, 517,952 tokens with MTP: a draft latent pool of
    (tokens + a page) bf16 rows of 576 and (tokens + page + 1) // page index pages of 64
    keys, 665,132,544 bytes (the issue states 665,132,552)."""
    plan = plan_of("dsv32_tp8_dp8_mtp_h200", max_total_tokens=517952)
    assert plan.max_total_num_tokens == 517952 or plan.max_total_num_tokens < 517952
    tokens, page = 517952, 64
    expected = (tokens + page) * 576 * 2 + (tokens + page + 1) // page * page * 132
    assert expected == 665132544
    capped = plan_of("dsv32_tp8_dp8_mtp_b200", max_total_tokens=tokens)
    # fp8 rows on B200: 576 one-byte elements.
    draft = sum(pool.size for pool in capped.pools if pool.name.startswith("draft_"))
    assert draft == (tokens + page) * 576 + (tokens + page + 1) // page * page * 132


def test_qwen3_next_intermediate_states() -> None:
    """Each of the 48 running requests (and a padding slot) keeps a temporal state and a conv
    window a draft token: 36 Mamba layers x 49 slots x 4 draft tokens x 8 x 128 x 128 float32,
    and the chain's shared conv row of 4 + 3 - 1 columns a channel."""
    plan = plan_of("qwen3next_tp4_eagle")
    pools = {pool.name: pool for pool in plan.pools}
    assert pools["mamba_intermediate_ssm"].size == 36 * 49 * 4 * 8 * 128 * 128 * 4
    assert pools["mamba_intermediate_conv0"].size == 36 * 49 * 2048 * 6 * 2
    assert pools["mamba_conv0"].num_blocks == 1112


def test_trace_records_the_speculative_rules() -> None:
    found = case("dsv32_tp8_dp8_mtp_h200")
    traced = plan_traced(request_from_server_args(
        found["config"], found["server_args"], found["memory"], gpu=found["gpu"]))
    decided = {d.subject: d.value for d in traced.trace.decisions
               if d.rule == "sglang.speculative"}
    assert decided["speculative_algorithm"] == "EAGLE"
    assert decided["steps, top-k, draft tokens"] == "3, 1, 4"
    assert decided["max_running_requests default"] == 48


@pytest.mark.parametrize(("server_args", "field"), [
    ({"speculative_num_draft_tokens": 4}, "engine.speculative_num_draft_tokens"),
    ({"speculative_algorithm": "NEXTN", "speculative_eagle_topk": 2},
     "engine.speculative_eagle_topk"),
    ({"speculative_algorithm": "NEXTN", "speculative_num_steps": 2},
     "engine.speculative_eagle_topk"),
    ({"speculative_algorithm": "NEXTN", "speculative_num_steps": 2, "speculative_eagle_topk": 2,
      "speculative_num_draft_tokens": 4}, "engine.speculative_eagle_topk"),
])
def test_refusals_name_the_setting(server_args: dict[str, Any], field: str) -> None:
    with pytest.raises(PlanError) as info:
        plan_of("dsv32_tp8_dp8_h200", **server_args)
    assert info.value.field == field


def test_eagle_without_draft_layers_refused() -> None:
    found = case("gptoss120b_tp8_eagle3")
    found.pop("draft_config")
    with pytest.raises(UnsupportedRequestError) as info:
        plan_sglang(request_from_server_args(found["config"], found["server_args"],
                                             found["memory"]))
    assert info.value.field == "engine.speculative_draft_num_layers"


def test_hybrid_window_draft_planned() -> None:
    """gpt-oss drafting with its own checkpoint: SGLang builds a hybrid-window draft pool, its
    window layers over the target's window tokens (test_sglang_window_draft.py pins it)."""
    found = case("gptoss120b_tp8_eagle3")
    found.pop("draft_config")
    found["server_args"].update(speculative_algorithm="EAGLE",
                                speculative_draft_model_path="@model")
    plan = plan_sglang(request_from_server_args(found["config"], found["server_args"],
                                                found["memory"]))
    check_plan(plan)
    blocks = {pool.name: pool.num_blocks for pool in plan.pools}
    assert blocks["draft_swa"] == blocks["swa"]
    assert blocks["draft_kv"] == blocks["kv"]


def test_topk_tree_widens_the_request_table() -> None:
    """Llama's automatic tree (5 steps, top-4, 8 tokens) on 16-token pages: each branch may
    straddle ceil((16 - 1 + 5) / 16) = 2 pages, so a decode step allocates 2 x 16 x 4 = 128
    and the table keeps 2 x 128 + 15 columns (SGLang: 4096 + 271)."""
    llama = str(REPO / "tests" / "hf_configs" / "llama-3.1-8b-instruct" / "config.json")
    request = request_from_server_args(llama, {
        "tp_size": 1, "context_length": 4096, "page_size": 16,
        "speculative_algorithm": "EAGLE", "speculative_draft_model_path": "@model",
    }, {"available_bytes": 8 << 30})
    plan = plan_sglang(request)
    assert plan.req_to_token.shape == [49, 4367]
    assert plan.speculative is not None
    assert plan.speculative.eagle_topk == 4


# --- check_plan: the draft pools proven from the plan alone --------------------------------


def tampered(plan: SGLangPlan, **changes: Any) -> SGLangPlan:
    spec = plan.speculative
    assert spec is not None
    return plan.model_copy(update={"speculative": spec.model_copy(update=changes)})


def test_check_plan_proves_the_draft() -> None:
    plan = plan_of("dsv32_tp8_dp8_mtp_h200")
    check_plan(plan)
    with pytest.raises(PlanInvariantError, match="cell_size_bytes"):
        check_plan(tampered(plan, draft_cell_size_bytes=1152))
    with pytest.raises(PlanInvariantError, match="num_steps \\+ 1"):
        check_plan(tampered(plan, num_draft_tokens=5))
    with pytest.raises(PlanInvariantError, match="draft"):
        check_plan(tampered(plan, draft_layers=["draft.layers.0", "draft.layers.1"]))
    with pytest.raises(PlanInvariantError, match="draft pools"):
        check_plan(plan.model_copy(update={"speculative": None}))


def test_check_plan_refuses_a_draft_pool_of_other_tokens() -> None:
    plan = plan_of("gptoss120b_tp8_eagle3")
    pools = [pool.model_copy(update={"num_blocks": pool.num_blocks - 1})
             if pool.name == "draft_kv" else pool for pool in plan.pools]
    with pytest.raises(PlanInvariantError):
        check_plan(plan.model_copy(update={"pools": pools}))


def test_check_plan_proves_the_intermediate_states() -> None:
    plan = plan_of("qwen3next_tp4_eagle")
    check_plan(plan)
    with pytest.raises(PlanInvariantError, match="slots"):
        check_plan(plan.model_copy(update={"max_running_requests": 47, "req_to_token": (
            plan.req_to_token.model_copy(update={"shape": [48, 8200]}))}))


def test_check_plan_against_the_request() -> None:
    found = case("dsv32_tp8_dp8_mtp_b200")
    request = request_from_server_args(found["config"], found["server_args"], found["memory"],
                                       gpu=found["gpu"])
    plan = plan_sglang(request)
    check_plan(plan, request=request)
    other = plan_of("dsv32_tp8_dp8_b200")
    with pytest.raises(PlanInvariantError):
        check_plan(other, request=request)


# --- the CLI: SGLang as documented for DeepSeek-V3.2 (DP attention + MTP) --------------------


@pytest.mark.parametrize("gpu", ["h200", "b200"])
def test_capacity_compare_with_mtp(cli: Run, gpu: str) -> None:
    argv = ("capacity", "deepseek-v3.2", "--engine", "vllm,sglang", "--gpu", gpu, "--tp", "8",
            "--enable-dp-attention", "--dp-size", "8", "--no-hisparse")
    code, plain, err = cli(*argv)
    assert (code, err) == (0, ""), err
    code, mtp, err = cli(*argv, "--speculative-algorithm", "nextn")
    assert (code, err) == (0, ""), err
    assert "speculative_algorithm EAGLE (NEXTN runs as EAGLE" in mtp
    assert "speculative_algorithm" not in plain
    slots = next(line for line in mtp.splitlines() if line.strip().startswith("request slots"))
    assert slots.split()[-1] == "6"  # 48 // 8 DP-attention groups


def test_capacity_refuses_speculative_flags_without_algorithm(cli: Run) -> None:
    code, _, err = cli("capacity", "deepseek-v3.2", "--engine", "sglang", "--gpu", "h200",
                       "--tp", "8", "--speculative-num-steps", "2")
    assert code != 0
    assert "--speculative-algorithm" in err


@pytest.mark.parametrize("gpu", ["h200", "b200"])
def test_capacity_compares_each_engine_as_documented(cli: Run, gpu: str) -> None:
    # vLLM: `-dp 8 --enable-expert-parallel` (8 GPUs); SGLang: DP attention + MTP on the same 8
    # GPUs (`--tp 8 --dp 8 --enable-dp-attention --speculative-algorithm NEXTN`), which the
    # CLI reads from vLLM's -dp with --enable-dp-attention.
    code, out, err = cli("capacity", "deepseek-v3.2", "--engine", "vllm,sglang", "--gpu", gpu,
                         "-dp", "8", "--enable-expert-parallel", "--enable-dp-attention",
                         "--speculative-algorithm", "NEXTN", "--no-hisparse", "--json")
    assert (code, err) == (0, ""), err
    vllm, sglang = json.loads(out)
    assert sglang["request_slots"] == 48 // 8  # SGLang's MTP default, per DP-attention group
    for figures in (vllm, sglang):
        # Each engine's node: its 8 GPUs' pools, each DP rank's (group's) requests.
        assert figures["node_device_bytes"] == 8 * figures["device_bytes"]
        assert figures["node_concurrency"] == pytest.approx(8 * figures["max_concurrency"])
    # The same SGLang deployment spelled with SGLang's own flags plans the same pools.
    code, own, err = cli("capacity", "deepseek-v3.2", "--engine", "sglang", "--gpu", gpu,
                         "--tp", "8", "--dp-size", "8", "--enable-dp-attention",
                         "--speculative-algorithm", "NEXTN", "--kv-cache-dtype", "fp8",
                         "--json")
    assert (code, err) == (0, ""), err
    spelled = json.loads(own)[0]
    assert (spelled["device_tokens"], spelled["bytes_per_token"]) == (
        sglang["device_tokens"], sglang["bytes_per_token"])
