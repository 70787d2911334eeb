"""HiSparse beside SGLang's KV budget (issue 26): the tensors SGLang 0.5.23's HiSparseCoordinator,
its host pool and its allocator allocate outside the budget, in the plan, in check_plan and in
the CLI; and the two HiSparse configurations the planner refuses though SGLang builds their
pools, each because SGLang's own code cannot run them.

Every pinned number was computed by SGLang's own code: references/sglang_reference.py builds
the pools with KVCacheConfigurator and then SGLang's HiSparseCoordinator (on device=meta, as
ModelRunner.maybe_init_hisparse_coordinator builds it) and lists its tensors:

    PYTHONPATH=references/sglang_stubs:references /work/sglang/bin/python \\
        references/sglang_reference.py CASE.json

with the case each test builds."""

from __future__ import annotations

import json
from typing import Any

import pytest

import hisparse_plan as hp
from hisparse_plan.adapters.sglang import report_for_case, request_from_server_args
from hisparse_plan.models.sglang_plan import SGLangPlan
from hisparse_plan.targets.sglang import plan_sglang
from support import paths
from support.cli_support import Run

GIB = 1 << 30
H200_TOTAL = 143771 << 20
FIXTURES = paths.HF_CONFIGS


def dsv32_h200(**args: Any) -> dict[str, Any]:
    """DeepSeek-V3.2 at TP 8 on an H200 with HiSparse (SGLang's defaults: fraction 0.886,
    top_k 2048, a 4096-row buffer, ratio 2), context 163840, 80 GiB of weights a rank."""
    return {
        "config": str(FIXTURES / "deepseek-v3.2-exp" / "config.json"),
        "server_args": {"tp_size": 8, "context_length": 163840, "kv_cache_dtype": "fp8_e4m3",
                        "dsa_backend": "flashmla_kv", "enable_hisparse": True,
                        "hisparse_config": {}, **args},
        "gpu": {"total_memory_bytes": H200_TOTAL, "name": "NVIDIA H200", "capability": [9, 0]},
        "memory": {"pre_model_load_free_bytes": H200_TOTAL - 2 * GIB,
                   "post_weights_free_bytes": H200_TOTAL - 82 * GIB},
    }


# SGLang: 815,488 device tokens, 2548 running requests (2549 slots), req_to_token 163,844 wide.
DSV32_H200_METADATA = [
    ("allocator", "full_to_hisparse_device_index_mapping", "device", "int64", (1631041,),
     13048328),
    ("allocator.hisparse", "free_pages", "device", "int64", (12742,), 101936),
    ("allocator.logical", "free_pages", "device", "int64", (25484,), 203872),
    ("coordinator", "_device_buffer_arange_i32", "device", "int32", (4096,), 16384),
    ("coordinator", "_lru_init", "device", "int16", (4096,), 8192),
    ("coordinator", "lru_slots", "device", "int16", (61, 2549, 4096), 1273765888),
    ("coordinator", "num_real_reqs", "device", "int32", (1,), 4),
    ("coordinator", "raw_indices_buffer", "device", "int32", (2549, 2048), 20881408),
    ("coordinator", "req_device_buffer_size", "host", "int64", (2549,), 20392),
    ("coordinator", "req_device_buffer_token_locs", "device", "int32", (61, 2549, 4160),
     2587336960),
    ("coordinator", "req_device_buffer_tokens", "device", "int32", (61, 2549, 4160),
     2587336960),
    ("coordinator", "req_to_device_buffer", "device", "int64", (2549, 4160), 84830720),
    ("coordinator", "req_to_host_pool", "device", "int64", (2549, 163908), 3342411936),
    ("coordinator", "req_to_host_pool_allocated_len", "host", "int64", (2549,), 20392),
    ("coordinator", "top_k_device_locs_buffer", "device", "int32", (2549, 2048), 20881408),
    ("host_pool", "data_ptrs", "device", "uint64", (61,), 488),
    ("host_pool", "free_slots", "host", "int64", (1631040,), 13048320),
    ("host_pool", "mem_state", "host", "uint8", (1631040,), 1631040),
    ("host_pool", "slot_used", "host", "bool", (1631040,), 1631040),
]


def metadata(report: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [(b["owner"], b["name"], b["location"], b["dtype"], tuple(b["shape"]), b["nbytes"])
            for b in report["hisparse_metadata"]]


def dsv32_plan() -> SGLangPlan:
    case = dsv32_h200()
    request = request_from_server_args(case["config"], case["server_args"], case["memory"],
                                       gpu=case["gpu"])
    plan = plan_sglang(request)
    hp.check_plan(plan, request=request)
    return plan


def test_deepseek_v32_tp8_h200_metadata_is_sglangs() -> None:
    report = report_for_case(dsv32_h200())
    assert (report["max_total_num_tokens"], report["max_running_requests"]) == (815_488, 2548)
    assert metadata(report) == DSV32_H200_METADATA
    on_gpu = sum(b[5] for b in DSV32_H200_METADATA if b[2] == "device")
    on_host = sum(b[5] for b in DSV32_H200_METADATA if b[2] == "host")
    assert (on_gpu, on_host) == (9_930_824_484, 16_351_184)  # 9.25 GiB beside the budget


def test_glm5_shared_index_adds_the_miss_plan() -> None:
    """GLM-5 sharing its index every 4th layer (offset 1): the coordinator plans prefetches
    for the sharing layers, three tensors more (SGLang: 13,837,774,152 device bytes)."""
    config = json.loads((FIXTURES / "glm-5" / "config.json").read_text())
    config.update(index_topk_freq=4, index_skip_topk_offset=1)
    report = report_for_case({
        "config": config, "gpu": {"capability": [9, 0]},
        "server_args": {"tp_size": 8, "context_length": 8192, "mem_fraction_static": 0.88,
                        "kv_cache_dtype": "fp8_e4m3", "enable_hisparse": True},
        "memory": {"available_bytes": 40 * GIB}})
    miss = [row for row in metadata(report) if row[1].startswith("_miss")]
    assert miss == [
        ("coordinator", "_miss_count", "device", "int32", (4097,), 16388),
        ("coordinator", "_miss_dst", "device", "int32", (4097, 2048), 33562624),
        ("coordinator", "_miss_src", "device", "int64", (4097, 2048), 67125248),
    ]
    assert sum(row[5] for row in metadata(report) if row[2] == "device") == 13_837_774_152
    assert sum(row[5] for row in metadata(report) if row[2] == "host") == 12_035_472


def _tampered(plan: SGLangPlan, edit: Any) -> SGLangPlan:
    data = plan.model_dump(mode="json")
    edit(data["hisparse"]["metadata"])
    return SGLangPlan.model_validate(data)


def _shape(buffers: list[dict[str, Any]]) -> None:
    buffers[5]["shape"] = [61, 2549, 4095]  # lru_slots one slot short


def _nbytes(buffers: list[dict[str, Any]]) -> None:
    buffers[0]["nbytes"] += 8


def _missing(buffers: list[dict[str, Any]]) -> None:
    del buffers[-1]


def _place(buffers: list[dict[str, Any]]) -> None:
    buffers[8]["location"] = "device"  # req_device_buffer_size lives on the host


def _half_miss_plan(buffers: list[dict[str, Any]]) -> None:
    buffers.append({"owner": "coordinator", "name": "_miss_count", "location": "device",
                    "dtype": "int32", "shape": [2549], "nbytes": 2549 * 4})


@pytest.mark.parametrize(("edit", "match"), [
    (_shape, "lru_slots"), (_nbytes, "nbytes"), (_missing, "slot_used"),
    (_place, "req_device_buffer_size"), (_half_miss_plan, "miss plan"),
])
def test_check_plan_proves_the_metadata(edit: Any, match: str) -> None:
    plan = dsv32_plan()
    with pytest.raises(hp.PlanInvariantError, match=match):
        hp.check_plan(_tampered(plan, edit))


def test_a_plan_without_metadata_still_checks() -> None:
    """Plans written before the field list none: nothing to prove."""
    plan = _tampered(dsv32_plan(), lambda buffers: buffers.clear())
    hp.check_plan(plan)


def test_the_plan_command_shows_it_beside_the_budget(cli: Run) -> None:
    code, out, err = cli("plan", "deepseek-v3.2", "--engine", "sglang", "--gpu", "h200",
                         "-tp", "8", "--enable-hisparse", "--kv-cache-dtype", "fp8_e4m3")
    assert code == 0, err
    line = next(line for line in out.splitlines() if "HiSparse metadata" in line)
    assert "GiB on the GPU (" in line
    assert "MiB on the host (" in line
    assert line.rstrip().endswith("beside the budget (19 tensors)")


def test_capacity_counts_it_beside_the_budget(cli: Run) -> None:
    code, out, err = cli("capacity", "deepseek-v3.2", "--engine", "sglang", "--gpu", "h200",
                         "-tp", "8", "--enable-hisparse", "--kv-cache-dtype", "fp8_e4m3")
    assert code == 0, err
    assert "beside the host pool" in out
    beside = next(line for line in out.splitlines() if line.strip().startswith("beside the b"))
    assert "GiB" in beside


def test_a_buffer_below_index_topk_is_refused_citing_sglangs_assert() -> None:
    """SGLang builds the pools (the config's top_k 512 passes its own check), but its decode
    swap-in asserts hot_buffer_size (1024) >= num_top_k (index_topk 2048)."""
    report = report_for_case(dsv32_h200(hisparse_config={"top_k": 512}))
    assert "hisparse_device_buffer_size" in report["error"]
    assert "asserts hot_buffer_size >= num_top_k" in report["error"]
    assert "docs/planning-rules.md" in report["error"]


def test_a_shared_index_whose_layer_0_shares_is_refused() -> None:
    """index_skip_topk_offset 0 makes layer 0 share: SGLang's DSA model asserts building it
    (dsa_layer_skips_topk: offset must be positive)."""
    config = json.loads((FIXTURES / "deepseek-v3.2-exp" / "config.json").read_text())
    config.update(index_topk_freq=3, index_skip_topk_offset=0)
    case = dsv32_h200()
    case["config"] = config
    report = report_for_case(case)
    assert "layer 0 must run its own indexer" in report["error"]
