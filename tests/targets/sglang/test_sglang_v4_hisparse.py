"""HiSparse on DeepSeek-V4 against SGLang 0.5.23's own pools: the shrunk HiSparseC4DevicePool
and the DeepSeekV4PagedHostPool its HiSparseCoordinator builds. The figures are literals,
computed with SGLang's own code by the reference harness (SGLang not imported here):

    PYTHONPATH=references/sglang_stubs:references /work/sglang/bin/python \\
        references/sglang_reference.py CASE.json

with CASE.json `{"config": V4_CONFIG, "server_args": SERVER_ARGS, "memory": MEMORY}`."""

from __future__ import annotations

from typing import Any

import pytest

from hisparse_plan.adapters.sglang import report, request_from_server_args
from hisparse_plan.checking import check_plan
from hisparse_plan.errors import PlanInvariantError
from hisparse_plan.models.sglang_plan import SGLangPlan
from hisparse_plan.targets.sglang import plan_sglang

V4_CONFIG = "references/sglang_cases/deepseek_v4_flash_config.json"
SERVER_ARGS: dict[str, Any] = {
    "tp_size": 8, "context_length": 8192, "mem_fraction_static": 0.9, "enable_hisparse": True,
    "hisparse_config": {"top_k": 512, "device_buffer_size": 1024, "host_to_device_ratio": 4},
}
MEMORY = {"pre_model_load_free_bytes": 149_250_113_536,
          "post_weights_free_bytes": 127_775_277_056}

SGLANG_POOLS: dict[str, tuple[int, int, list[int], str]] = {
    # name: (tokens SGLang's pool reports, buffers, the first buffer's shape, location)
    "v4_c128": (179_880, 20, [90_068, 1728], "device"),
    "v4_c4": (1_439_040, 21, [22_489, 37_440], "device"),
    "v4_hisparse_host": (5_756_160, 21, [89_940, 37_440], "host"),
    "v4_index_c4": (5_756_160, 21, [89_944, 8448], "device"),
    "v4_index_state_c4": (71_964, 21, [71_964, 512], "device"),
    "v4_state_c128": (33_152, 20, [33_152, 1024], "device"),
    "v4_state_c4": (71_964, 21, [71_964, 2048], "device"),
    "v4_swa": (2_302_464, 43, [8995, 149_760], "device"),
}


def v4_plan(**server_args: Any) -> SGLangPlan:
    return plan_sglang(request_from_server_args(V4_CONFIG, {**SERVER_ARGS, **server_args},
                                                MEMORY))


def test_matches_sglangs_own_pools() -> None:
    plan = v4_plan()
    got = report(plan)
    assert (got["max_total_num_tokens"], got["max_running_requests"]) == (23_024_640, 256)
    assert got["available_bytes"] == 112_850_265_702
    assert got["req_to_token"]["shape"] == [257, 8196]
    pools = {entry["name"]: entry for entry in got["pools"]}
    assert sorted(pools) == sorted(SGLANG_POOLS)
    for name, (tokens, buffers, shape, location) in SGLANG_POOLS.items():
        entry = pools[name]
        assert (entry["tokens"], len(entry["buffers"]), entry["location"]) == (
            tokens, buffers, location), name
        assert entry["buffers"][0]["shape"] == shape, name
    hisparse = plan.hisparse
    assert hisparse is not None
    # The coordinator runs the model's index_topk; its hot buffer is padded by one c4 page.
    assert (hisparse.top_k, hisparse.device_buffer_size, hisparse.hot_rows_per_request) == (
        512, 1024, 1088)
    # SGLang's HiSparse allocator hands out full-token ids (size_full = max_total_num_tokens);
    # the host pool mirrors the compressed quarter of them.
    assert (hisparse.host_tokens, hisparse.logical_tokens) == (5_756_160, 23_024_640)


def test_top_k_is_the_configs_index_topk() -> None:
    """ModelRunner hands the coordinator hf_text_config.index_topk (512 on V4-Flash), whatever
    hisparse_config's top_k says (it only sets the default device buffer)."""
    plan = v4_plan(hisparse_config={"top_k": 2048, "host_to_device_ratio": 4})
    assert plan.hisparse is not None
    assert (plan.hisparse.top_k, plan.hisparse.device_buffer_size) == (512, 4096)


def test_hisparse_shrinks_only_the_c4_rows() -> None:
    """Without HiSparse the c4 pool holds a quarter of the full tokens; with ratio 4 a
    sixteenth of more full tokens (the freed c4 bytes buy tokens for every pool)."""
    plain = v4_plan(enable_hisparse=False, hisparse_config=None)
    shrunk = v4_plan()
    assert plain.deepseek_v4 is not None
    assert shrunk.deepseek_v4 is not None
    assert plain.deepseek_v4.c4_tokens == plain.max_total_num_tokens // 4
    assert shrunk.deepseek_v4.c4_tokens == shrunk.max_total_num_tokens // 16
    assert shrunk.max_total_num_tokens > plain.max_total_num_tokens
    assert shrunk.budget.cell_size_bytes < plain.budget.cell_size_bytes
    check_plan(shrunk)


def _edited(plan: SGLangPlan, where: str, value: Any) -> dict[str, Any]:
    data = plan.model_dump(mode="json")
    section, field = where.split(".")
    if section == "pools":
        pool = next(p for p in data["pools"] if p["name"] == "v4_hisparse_host")
        pool[field] = value
    else:
        data[section][field] = value
    return data


@pytest.mark.parametrize(
    ("where", "value", "match"),
    [
        ("hisparse.host_tokens", 5_756_224, "hisparse.host_tokens"),
        ("hisparse.logical_tokens", 5_756_160, "hisparse.logical_tokens"),
        ("hisparse.hot_rows_per_request", 1280, "hot_rows_per_request"),
        ("deepseek_v4.c4_tokens", 5_756_160, "c4_tokens"),
        ("pools.padding_blocks", 1, "padding blocks"),
    ],
)
def test_check_plan_refuses_broken_figures(where: str, value: Any, match: str) -> None:
    with pytest.raises(PlanInvariantError, match=match):
        check_plan(_edited(v4_plan(), where, value))
