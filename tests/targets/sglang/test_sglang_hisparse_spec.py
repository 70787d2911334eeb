"""HiSparse with speculative decoding on SGLang 0.5.23 (issue 26): the tables the coordinator's
speculative swap (HiSparseSpecSwapManager) allocates beside the budget, in the plan and in
check_plan's proof, and the startup checks SGLang runs on it after building the pools.

Every pinned number was computed by SGLang's own code: references/sglang_reference.py builds
the pools with KVCacheConfigurator and then HiSparseCoordinator on device=meta, handed the
resolved speculative_num_draft_tokens as ModelRunner.maybe_init_hisparse_coordinator hands it,
and lists its tensors (or, where the coordinator raises, reports the case unusable):

    PYTHONPATH=references/sglang_stubs:references /work/sglang/bin/python \\
        references/sglang_reference.py - < CASES.json

with the cases the tests below build (dsv32_h200 of test_sglang_hisparse_meta: DeepSeek-V3.2,
TP 8, H200, SGLang's default fraction and HiSparse defaults: top_k 2048, a 4096-row buffer)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from test_sglang_hisparse_meta import FIXTURES, GIB, dsv32_h200, metadata

import hisparse_plan as hp
from hisparse_plan.adapters.sglang import report_for_case, request_from_server_args
from hisparse_plan.checking.sglang_hisparse_meta import check_hisparse_metadata
from hisparse_plan.errors import PlanError
from hisparse_plan.models.sglang_plan import SGLangPlan
from hisparse_plan.targets.sglang import plan_sglang
from support.cli_support import Run

MTP = {"speculative_algorithm": "NEXTN"}
STEPS_2 = {**MTP, "speculative_num_steps": 2, "speculative_eagle_topk": 1,
           "speculative_num_draft_tokens": 3}

# SGLang, NEXTN with its defaults (3 steps, top-k 1, 4 draft tokens): 793,216 device tokens,
# 48 running requests (49 slots), 61 layers; 500,580,352 B of swap tables.
SPEC_SWAP_4 = [
    ("spec_swap", "_cache_index", "device", "int64", (61, 49, 2, 8192), 391774208),
    ("spec_swap", "_cache_policy", "device", "int32", (61, 50, 4096), 49971200),
    ("spec_swap", "_hash_entries", "device", "int64", (4096,), 32768),
    ("spec_swap", "_hash_slots", "device", "int64", (4096,), 32768),
    ("spec_swap", "_scratch_state", "device", "int32", (50, 40960), 8192000),
    ("spec_swap", "req_to_scratch", "device", "int32", (61, 49, 4096), 48971776),
    ("spec_swap", "top_k_device_locs", "device", "int32", (49, 4, 2048), 1605632),
]
# SGLang, 2 steps and 3 draft tokens: the scratch halves (max(1024, 3 x 2048 - 4096) rows).
SPEC_SWAP_3 = [
    ("spec_swap", "_cache_index", "device", "int64", (61, 49, 2, 8192), 391774208),
    ("spec_swap", "_cache_policy", "device", "int32", (61, 50, 4096), 49971200),
    ("spec_swap", "_hash_entries", "device", "int64", (4096,), 32768),
    ("spec_swap", "_hash_slots", "device", "int64", (4096,), 32768),
    ("spec_swap", "_scratch_state", "device", "int32", (50, 30720), 6144000),
    ("spec_swap", "req_to_scratch", "device", "int32", (61, 49, 2048), 24485888),
    ("spec_swap", "top_k_device_locs", "device", "int32", (49, 3, 2048), 1204224),
]


@pytest.mark.parametrize(("args", "table", "swap", "on_gpu"), [
    (MTP, [49, 163911], SPEC_SWAP_4, 704_266_396),
    (STEPS_2, [49, 163909], SPEC_SWAP_3, 677_330_316),
], ids=["nextn-default-4", "nextn-3"])
def test_deepseek_v32_tp8_h200_mtp_swap_tables_are_sglangs(
    args: dict[str, Any], table: list[int], swap: list[tuple[Any, ...]], on_gpu: int,
) -> None:
    report = report_for_case(dsv32_h200(**args))
    assert "error" not in report, report.get("error")
    assert (report["max_total_num_tokens"], report["max_running_requests"],
            report["req_to_token"]["shape"]) == (793_216, 48, table)
    listed = metadata(report)
    assert [row for row in listed if row[0] == "spec_swap"] == swap
    assert sum(row[5] for row in swap) == sum(
        (391774208, 49971200, 32768, 32768, swap[4][5], swap[5][5], swap[6][5]))
    # SGLang: all of HiSparse's tensors beside the budget, 15,865,744 B of them on the host.
    assert sum(row[5] for row in listed if row[2] == "device") == on_gpu
    assert sum(row[5] for row in listed if row[2] == "host") == 15_865_744


def test_glm5_shared_index_miss_plan_spans_the_draft_tokens() -> None:
    """With 4 draft tokens the anchor's miss plan is 4 x top_k wide (miss_plan_capacity);
    SGLang: 815,973,320 device bytes in all, 637,337,600 of them the swap's."""
    config = json.loads((FIXTURES / "glm-5" / "config.json").read_text())
    config.update(index_topk_freq=4, index_skip_topk_offset=1)
    report = report_for_case({
        "config": config, "gpu": {"capability": [9, 0]},
        "server_args": {"tp_size": 8, "context_length": 8192, "mem_fraction_static": 0.88,
                        "kv_cache_dtype": "fp8_e4m3", "enable_hisparse": True, **MTP},
        "memory": {"available_bytes": 40 * GIB}})
    listed = metadata(report)
    assert [row for row in listed if row[1].startswith("_miss")] == [
        ("coordinator", "_miss_count", "device", "int32", (49,), 196),
        ("coordinator", "_miss_dst", "device", "int32", (49, 8192), 1605632),
        ("coordinator", "_miss_src", "device", "int64", (49, 8192), 3211264),
    ]
    assert sum(row[5] for row in listed if row[2] == "device") == 815_973_320
    assert sum(row[5] for row in listed if row[0] == "spec_swap") == 637_337_600


def _with_topk(case: dict[str, Any], top_k: int) -> dict[str, Any]:
    config = json.loads((FIXTURES / "deepseek-v3.2-exp" / "config.json").read_text())
    config["index_topk"] = top_k
    case["config"] = config
    return case


# Each refused by SGLang when it starts, after building the pools (the reference's
# `unusable`: "coordinator startup: " and SGLang's message).
REFUSED = {
    # "HiSparse spec swap requires 2-4 draft tokens and top_k >= 1024."
    "five-draft-tokens": (dsv32_h200(**{**MTP, "speculative_num_steps": 4,
                                        "speculative_eagle_topk": 1,
                                        "speculative_num_draft_tokens": 5}),
                          "engine.speculative_num_draft_tokens", "got 5 draft tokens"),
    "top-k-512": (_with_topk(dsv32_h200(**MTP, hisparse_config={"top_k": 512}), 512),
                  "model.index_topk", "top_k 512"),
    # "HiSparse spec swap supports at most 8192 occurrences."
    "workspace": (_with_topk(dsv32_h200(**MTP, hisparse_config={"top_k": 4096}), 4096),
                  "engine.speculative_num_draft_tokens", "4 x 4096 = 16384"),
    # "HiSparse spec request capacity must not exceed device_buffer_size."
    "slots": (dsv32_h200(**MTP, max_running_requests=4096),
              "engine.max_running_requests", "at most 4096 request slots"),
    # "HiSparse spec scratch and device buffer sizes must be non-negative multiples of
    # page_size=64.": the padded buffer 4100 + 64 (even without drafts), and a scratch of
    # 4 x 1100 - 2048 = 2352 rows.
    "unpaged-buffer": (dsv32_h200(hisparse_config={"device_buffer_size": 4100}),
                       "engine.hisparse_device_buffer_size", "device_buffer_size 4100"),
    "unpaged-scratch": (_with_topk(dsv32_h200(**MTP, hisparse_config={
        "top_k": 1100, "device_buffer_size": 2048}), 1100),
        "engine.hisparse_device_buffer_size", "scratch (2352 rows)"),
}


@pytest.mark.parametrize(("case", "field", "got"), list(REFUSED.values()), ids=list(REFUSED))
def test_sglangs_startup_refusals(case: dict[str, Any], field: str, got: str) -> None:
    with pytest.raises(PlanError) as refused:
        plan_sglang(request_from_server_args(case["config"], case["server_args"],
                                             case["memory"], gpu=case["gpu"]))
    assert refused.value.field == field
    message = str(refused.value)
    assert message.startswith(field)
    assert got in message
    assert "expected" in message
    assert "docs/planning-rules.md#sglang-speculative-decoding" in message


def _mtp_plan() -> dict[str, Any]:
    case = dsv32_h200(**MTP)
    request = request_from_server_args(case["config"], case["server_args"], case["memory"],
                                       gpu=case["gpu"])
    plan = plan_sglang(request)
    hp.check_plan(plan, request=request)
    return plan.model_dump(mode="json")


def _spec(plan: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(b for b in plan["hisparse"]["metadata"]
                                 if (b["owner"], b["name"]) == ("spec_swap", name))
    return found


def _drop_cache_index(plan: dict[str, Any]) -> None:
    plan["hisparse"]["metadata"].remove(_spec(plan, "_cache_index"))


def _narrow_scratch(plan: dict[str, Any]) -> None:
    scratch = _spec(plan, "req_to_scratch")
    scratch["shape"] = [61, 49, 2048]
    scratch["nbytes"] = 61 * 49 * 2048 * 4


def _three_draft_tokens(plan: dict[str, Any]) -> None:
    """2 steps and 3 draft tokens, the swap's tables still sized for 4."""
    plan["speculative"].update(num_steps=2, num_draft_tokens=3)


def _five_draft_tokens(plan: dict[str, Any]) -> None:
    """Every table resized for 5 draft tokens: what SGLang would refuse to start with."""
    plan["speculative"].update(num_steps=4, num_draft_tokens=5)
    for name, shape in (("_scratch_state", [50, 5 * 5 * 2048]),
                        ("req_to_scratch", [61, 49, 5 * 2048 - 4096]),
                        ("top_k_device_locs", [49, 5, 2048])):
        _spec(plan, name).update(shape=shape, nbytes=shape[0] * shape[1] * shape[2] * 4
                                 if len(shape) == 3 else shape[0] * shape[1] * 4)


def _no_drafts(plan: dict[str, Any]) -> None:
    plan["speculative"] = None  # the swap's tables are still listed


@pytest.mark.parametrize(("edit", "match"), [
    (_drop_cache_index, "_cache_index"), (_narrow_scratch, "req_to_scratch"),
])
def test_check_plan_proves_the_swap_tables(edit: Any, match: str) -> None:
    plan = _mtp_plan()
    hp.check_plan(SGLangPlan.model_validate(plan))
    edit(plan)
    with pytest.raises(hp.PlanInvariantError, match=match):
        hp.check_plan(SGLangPlan.model_validate(plan))


@pytest.mark.parametrize(("edit", "match"), [
    (_three_draft_tokens, "_scratch_state"), (_five_draft_tokens, "5 draft tokens"),
    (_no_drafts, "spec_swap"),
])
def test_the_metadata_proof_reads_the_draft_tokens(edit: Any, match: str) -> None:
    """The draft tokens tampered with alone (check_plan's other proofs of the draft worker
    would refuse them first): the metadata proof sizes the swap by them."""
    plan = _mtp_plan()
    edit(plan)
    with pytest.raises(hp.PlanInvariantError, match=match):
        check_hisparse_metadata(SGLangPlan.model_validate(plan))


def test_the_plan_command_counts_the_swap_tables(cli: Run) -> None:
    """19 tensors without drafts (test_sglang_hisparse_meta), 7 more with MTP."""
    code, out, err = cli("plan", "deepseek-v3.2", "--engine", "sglang", "--gpu", "h200",
                         "-tp", "8", "--enable-hisparse", "--kv-cache-dtype", "fp8_e4m3",
                         "--speculative-algorithm", "NEXTN")
    assert code == 0, err
    line = next(line for line in out.splitlines() if "HiSparse metadata" in line)
    assert line.rstrip().endswith("beside the budget (26 tensors)")
