"""`capacity MODEL --compare`: deployments side by side, as a table, JSON and two pictures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hisparse_plan.operator.deployments import (
    DeploymentComparison,
    deployment_grid,
)
from support import paths
from support.cli_support import Run

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def compared(cli: Run, *argv: str) -> DeploymentComparison:
    code, out, err = cli("capacity", *argv, "--compare", "--json")
    assert (code, err) == (0, ""), err
    return DeploymentComparison.model_validate_json(out)


def test_default_grid_fills_a_node() -> None:
    grid = deployment_grid(gpus=("h200",), tps=None, dps=None, pp=1,
                           kv_cache_dtypes=("auto",), hisparse=(False,))
    assert [(d.tp, d.dp) for d in grid] == [(1, 8), (2, 4), (4, 2), (8, 1)]
    fixed = deployment_grid(gpus=("h200",), tps=(2,), dps=None, pp=2,
                            kv_cache_dtypes=("auto",), hisparse=(False,))
    assert [(d.tp, d.dp, d.pp) for d in fixed] == [(2, 2, 2)]


def test_regular_model_over_gpus_splits_and_dtypes(cli: Run) -> None:
    result = compared(cli, "llama-3-70b", "--max-model-len", "32k")
    assert len(result.results) == 3 * 4 * 2  # GPUs x (tp, dp) x (auto, fp8); no HiSparse
    by_key = {(r.deployment.gpu, r.deployment.tp, r.deployment.kv_cache_dtype): r
              for r in result.results}
    auto, fp8 = by_key[("h200", 8, "auto")], by_key[("h200", 8, "fp8")]
    assert (auto.kv_dtype, fp8.kv_dtype) == ("bfloat16", "fp8_e4m3")
    assert auto.per_rank_concurrency is not None
    assert fp8.per_rank_concurrency is not None
    assert fp8.per_rank_concurrency == pytest.approx(2 * auto.per_rank_concurrency, rel=1e-3)
    two = by_key[("h200", 2, "auto")]
    assert two.deployment.dp == 4
    assert two.node_concurrency == 4 * (two.per_rank_concurrency or 0)
    memory = auto.memory
    assert memory is not None
    assert (memory.held_back + memory.weights + memory.activation_reserve
            + memory.kv_cache_pool + memory.kv_cache_left_over) == memory.hbm
    refused = by_key[("h100", 1, "auto")]  # 141 GB of weights on one 80 GB GPU
    assert refused.refusal is not None
    assert "leaves no KV cache" in refused.refusal


def test_sparse_mla_model_compares_hisparse_on_and_off(cli: Run) -> None:
    result = compared(cli, "deepseek-v3.2", "--gpu", "h200", "--enable-expert-parallel",
                      "-tp", "1")
    assert [(r.deployment.kv_cache_dtype, r.deployment.hisparse) for r in result.results] == [
        ("auto", True), ("auto", False), ("fp8", True), ("fp8", False)]
    on = result.results[2]
    assert (on.kv_dtype, on.binding, on.deployment.dp) == ("fp8_ds_mla", "host", 8)
    assert on.host_pool_bytes == 64 * 2**30
    assert on.node_concurrency == pytest.approx(8 * 10.48, abs=0.01)


def test_given_memory_collapses_the_gpu_axis_and_caps_apply(cli: Run) -> None:
    result = compared(cli, "llama-3-8b", "--gpu-mem", "20GiB", "--max-num-seqs", "4")
    assert {r.deployment.gpu for r in result.results} == {None}
    assert all(r.memory is None for r in result.results)
    assert all(r.per_rank_concurrency == 4 for r in result.results)


def test_table_numbers_refusals(cli: Run) -> None:
    code, out, err = cli("capacity", "llama-3-70b", "--compare", "--gpu", "h100", "--plain")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].startswith("Llama-3-70B: deployments")
    assert any(line.startswith("h100  tp8 dp1  fp8_e4m3") for line in lines)
    assert "refused (1)" in out
    assert any(line.startswith("(1) gpu: NVIDIA H100") for line in lines)


def test_compare_needs_one_model(cli: Run, tmp_path: Path) -> None:
    for argv in (["--request", "x.json"], [], ["llama-3-8b", "--hf-config", "x.json"]):
        code, out, err = cli("capacity", *argv, "--compare")
        assert (code, out) == (2, "")
        assert "--compare needs exactly one of MODEL or --hf-config FILE" in err


def test_compare_a_config_json_on_given_memory(cli: Run, tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({
        "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
        "hidden_size": 1024, "max_position_embeddings": 4096,
    }))
    result = compared(cli, "--hf-config", str(config), "--gpu-mem", "1GiB")
    assert len(result.results) == 4 * 2
    assert all(r.refusal is None for r in result.results)
    code, out, err = cli("capacity", "--hf-config", str(config), "--gpu", "h100", "--compare")
    assert (code, out) == (2, "")
    assert "--compare: --gpu: no model.safetensors.index.json beside" in err
    assert "--weights-bytes SIZE or --parameters N; or give the KV memory per GPU" in err
    on_gpus = compared(cli, "--hf-config", str(config), "--gpu", "h100", "--weights-bytes",
                       "2GiB")
    assert all(r.refusal is None for r in on_gpus.results)
    assert {r.memory.weights for r in on_gpus.results if r.memory is not None and
            r.deployment.tp == 2} == {2**30}


def test_compare_reads_the_weights_from_the_safetensors_index(cli: Run) -> None:
    folder = paths.HF_CONFIGS / "llama-3.1-8b-instruct"
    total = json.loads((folder / "model.safetensors.index.json").read_text())[
        "metadata"]["total_size"]
    result = compared(cli, "--hf-config", str(folder / "config.json"), "--gpu", "h200",
                      "--max-model-len", "32k")
    assert all(r.refusal is None for r in result.results)
    assert {(r.deployment.tp, r.memory.weights) for r in result.results
            if r.memory is not None} == {(tp, -(-total // tp)) for tp in (1, 2, 4, 8)}


def test_compare_pictures(cli: Run, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    table, memory = tmp_path / "compare.png", tmp_path / "memory.png"
    code, out, err = cli("capacity", "deepseek-v3.2", "--compare", "--enable-expert-parallel",
                         "--plot", str(table), "--plot-memory", str(memory))
    assert (code, err) == (0, "")
    assert f"plot: {table}" in out
    for path in (table, memory):
        assert path.read_bytes().startswith(PNG_MAGIC)
        assert path.stat().st_size > 10_000


def test_plot_memory_needs_compare(cli: Run) -> None:
    code, _, err = cli("capacity", "deepseek-v3.2", "--plot-memory", "x.png")
    assert code == 2
    assert "--plot-memory and --node-gpus need --compare" in err


def test_a_refused_plan_still_shows_where_the_gpu_memory_went(cli: Run) -> None:
    result = compared(cli, "llama-3-70b", "--gpu", "h100", "-tp", "2")
    refused = result.results[0]  # 141 GB of weights over 2 H100s leave 1.93 GiB: no request fits
    assert refused.refusal is not None
    assert "see docs/planning-rules.md#admission" in refused.refusal
    memory = refused.memory
    assert memory is not None
    assert memory.kv_cache_pool == 0
    assert memory.kv_cache_left_over == refused.kv_cache_bytes
