"""Issue 28: every figure that names a deployment counts all its ranks (tp x pp x dp), host DRAM
included, and `plan` and `capacity` give the same node figure for the same flags.

The expected figures are computed here from the plan's own per-rank fields (one rank's pools
and concurrency) with the deployment's rank counts, never with `operator.node`."""

from __future__ import annotations

import json
from typing import Any

import pytest

import hisparse_plan as hp
from hisparse_plan.errors import PlanError
from hisparse_plan.operator.node import Ranks, node_figures
from hisparse_plan.presets import Settings, build_request, load_preset
from support.cli_support import Run

GIB = 2**30
H200_HBM = 143771 * 2**20
DP_EP = ("deepseek-v3.2", "--gpu", "h200", "-dp", "8", "--enable-expert-parallel")
"""A row of the README's `vllm serve` table: eight DP ranks of one GPU each, experts sharded."""


def _json(cli: Run, *argv: str) -> Any:
    code, out, err = cli(*argv, "--json")
    assert code == 0, err
    return json.loads(out)


def test_plan_and_capacity_give_the_same_node_figure_for_dp_8(cli: Run) -> None:
    body = _json(cli, "plan", *DP_EP)
    plan = hp.KVCachePlan.model_validate(body["plan"])
    one_rank = plan.capacity.max_concurrency
    node = 8 * one_rank  # each DP rank holds its own requests
    deployment = body["memory"]["deployment"]
    # Before issue 28 this was one DP rank's figure (10.48) as the deployment's.
    assert deployment["max_concurrency"] == pytest.approx(node, rel=1e-12)
    assert deployment["max_concurrency"] == pytest.approx(83.85, abs=0.005)
    assert deployment["per_dp_rank_concurrency"] == one_rank
    assert (deployment["gpus"], deployment["tp"], deployment["pp"], deployment["dp"]) == (
        8, 1, 1, 8)
    assert deployment["hbm_bytes"] == 8 * H200_HBM
    assert deployment["kv_cache_bytes"] == 8 * plan.device_pool.size
    # Eight host pools, one per DP rank, of the 64 GiB default budget.
    assert plan.host_pool is not None
    assert (deployment["host_pools"], deployment["host_pool_bytes"]) == (8, 8 * 64 * GIB)
    # Experts sharded over the eight ranks: one copy of the weights in the node.
    assert deployment["weights_bytes"] == 685_000_000_000

    engines = _json(cli, "capacity", *DP_EP, "--engine", "vllm")
    assert engines[0]["node_concurrency"] == deployment["max_concurrency"]
    assert engines[0]["node_host_bytes"] == deployment["host_pool_bytes"]
    assert engines[0]["node_device_bytes"] == deployment["kv_cache_bytes"]
    compared = _json(cli, "capacity", *DP_EP, "--compare", "--kv-cache-dtype", "fp8",
                     "--tp", "1")
    hisparse = [r for r in compared["results"] if r["deployment"]["hisparse"]]
    assert [r["node_concurrency"] for r in hisparse] == [deployment["max_concurrency"]]
    assert hisparse[0]["node_host_pool_bytes"] == deployment["host_pool_bytes"]
    assert hisparse[0]["node_kv_cache_bytes"] == deployment["kv_cache_bytes"]


def test_the_text_says_the_node_figure_everywhere(cli: Run) -> None:
    code, out, err = cli("plan", *DP_EP, "--plain")
    assert code == 0, err
    deployment = out.splitlines()[-1]
    assert deployment.startswith("deployment: 8 x NVIDIA H200 141GB HBM3e (tp 1 x pp 1 x dp 8)")
    assert "host DRAM 512 GiB (8 host pools)" in deployment
    assert deployment.endswith("83.85 concurrent max_model_len requests")
    assert "node  83.85 = 8 DP ranks x 10.48" in out
    code, out, err = cli("capacity", *DP_EP, "--plain")
    assert code == 0, err
    assert "node  83.85 = 8 DP ranks x 10.48" in out
    code, out, err = cli("capacity", *DP_EP, "--engine", "vllm", "--plain")
    assert code == 0, err
    assert "one rank's KV pools and the node's" in out.splitlines()[0]
    rows = {line[:35].strip(): line[35:].strip() for line in out.splitlines()[3:]}
    assert rows["node: max concurrent (8 DP ranks)"] == "83.85"
    assert rows["node: host pools"] == "512 GiB"


def test_without_expert_parallel_each_dp_rank_holds_a_copy_of_the_weights(cli: Run) -> None:
    body = _json(cli, "plan", "llama-3-70b", "--gpu", "h200", "-tp", "2", "-dp", "2",
                 "--max-model-len", "8192", "--max-num-seqs", "16")
    plan = hp.KVCachePlan.model_validate(body["plan"])
    deployment = body["memory"]["deployment"]
    assert (deployment["gpus"], deployment["hbm_bytes"]) == (4, 4 * H200_HBM)
    assert deployment["weights_bytes"] == 2 * 70_600_000_000 * 2  # two bf16 copies
    assert deployment["kv_cache_bytes"] == 4 * plan.device_pool.size
    assert (deployment["host_pools"], deployment["host_pool_bytes"]) == (0, None)
    # Each DP rank runs at most --max-num-seqs requests.
    assert plan.capacity.max_concurrency > 16
    assert (deployment["per_dp_rank_concurrency"], deployment["max_concurrency"]) == (16, 32)


def test_pipeline_stages_count_every_stage_pool(cli: Run) -> None:
    body = _json(cli, "plan", "llama-3-70b", "--gpu", "h100", "-tp", "2", "-pp", "2", "-dp",
                 "2", "--max-model-len", "8192")
    plan = hp.KVCachePlan.model_validate(body["plan"])
    deployment = body["memory"]["deployment"]
    assert len(plan.device_pools) == 2
    assert deployment["gpus"] == 8
    assert deployment["kv_cache_bytes"] == 2 * 2 * sum(p.size for p in plan.device_pools)
    assert deployment["max_concurrency"] == 2 * plan.capacity.max_concurrency


def test_an_unshared_host_pool_is_one_per_rank() -> None:
    request = build_request(load_preset("deepseek-v3.2").architecture,
                            Settings(tp=2, max_model_len=32768))
    assert request.hisparse is not None
    assert request.hisparse.shared_host_pool
    shared = hp.plan(request)
    data = request.model_dump(mode="json")
    data["hisparse"]["shared_host_pool"] = False
    private = hp.plan(data)
    assert private.host_pool is not None
    assert shared.host_pool is not None
    assert node_figures(shared, Ranks(tp=2, dp=3)).host_pools == 3
    assert node_figures(private, Ranks(tp=2, dp=3)).host_pools == 6
    assert node_figures(private, Ranks(tp=2, dp=3)).host_pool_bytes == (
        6 * private.host_pool.budget_bytes)


def test_node_figures_refuse_ranks_of_another_deployment() -> None:
    plan = hp.plan(build_request(load_preset("llama-3-8b").architecture,
                                 Settings(max_model_len=4096)))
    with pytest.raises(PlanError, match=r"ranks.pp: expected the plan's 1 pipeline stage\(s\), "
                                        r"got 2") as refused:
        node_figures(plan, Ranks(pp=2))
    assert refused.value.field == "ranks.pp"
