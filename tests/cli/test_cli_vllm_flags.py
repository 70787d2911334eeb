"""vLLM's serving flags, with vLLM's spelling and meaning, and the older spellings as aliases."""

from __future__ import annotations

import json
import re
import shlex
from typing import Any

import pytest

from support import paths
from support.cli_support import Run

GIB = 2**30
BLOCK = 64
"""vLLM 0.34's default block size, which the presets take."""


def planned(cli: Run, *argv: str) -> dict[str, Any]:
    """The plan `plan --json` prints (with --gpu, beside where the HBM went)."""
    code, out, err = cli("plan", *argv, "--json")
    assert (code, err) == (0, ""), err
    printed: dict[str, Any] = json.loads(out)
    plan: dict[str, Any] = printed["plan"] if "--gpu" in argv else printed
    return plan


def page(plan: dict[str, Any]) -> int:
    size: int = plan["groups"][0]["spec"]["page_size_bytes"]
    return size


@pytest.mark.parametrize("flag", ["-tp", "--tensor-parallel-size", "--tp"])
def test_tensor_parallel_splits_kv_heads(cli: Run, flag: str) -> None:
    one = planned(cli, "llama-3-8b")
    two = planned(cli, "llama-3-8b", flag, "2")
    assert page(one) == BLOCK * 2 * 8 * 128 * 2  # K and V, 8 heads of 128, bf16
    assert page(two) == page(one) // 2


@pytest.mark.parametrize("flag", ["-pp", "--pipeline-parallel-size", "--pp"])
def test_pipeline_parallel_makes_stages(cli: Run, flag: str) -> None:
    plan = planned(cli, "llama-3-70b", flag, "4", "--max-model-len", "32k")
    assert [len(pool["layers"]) for pool in plan["device_pools"]] == [20, 20, 20, 20]


@pytest.mark.parametrize("flag", ["-dp", "--data-parallel-size", "--dp"])
def test_data_parallel_multiplies_node_concurrency(cli: Run, flag: str) -> None:
    assert planned(cli, "deepseek-v3.2", flag, "8") == planned(cli, "deepseek-v3.2")
    code, out, _ = cli("plan", "deepseek-v3.2", flag, "8", "--plain")
    assert code == 0
    assert "node  83.85 = 8 DP ranks x 10.48" in out


@pytest.mark.parametrize(
    ("model", "value", "dtype", "row_page"),
    [
        ("llama-3-8b", "auto", "bfloat16", BLOCK * 4096),
        ("llama-3-8b", "bfloat16", "bfloat16", BLOCK * 4096),
        ("llama-3-8b", "fp8", "uint8", BLOCK * 2048),
        ("llama-3-8b", "fp8_e4m3", "uint8", BLOCK * 2048),
        ("llama-3-8b", "fp8_e5m2", "uint8", BLOCK * 2048),
        ("gemma-3-27b", "fp8", "uint8", BLOCK * 2 * 16 * 128),
        ("deepseek-v3.2", "fp8", "fp8_ds_mla", 64 * 656),
        ("deepseek-v3.2", "fp8_e4m3", "fp8_ds_mla", 64 * 656),
        ("deepseek-v3.2", "fp8_ds_mla", "fp8_ds_mla", 64 * 656),
        ("deepseek-v3.2", "auto", "bfloat16", 64 * 576 * 2),
    ],
)
def test_kv_cache_dtype_has_vllm_meaning_per_model(
    cli: Run, model: str, value: str, dtype: str, row_page: int
) -> None:
    plan = planned(cli, model, "--kv-cache-dtype", value)
    if model == "deepseek-v3.2":  # the latent rows of 61 layers in the host pool
        assert plan["host_pool"]["bytes_per_block"] == 61 * row_page
    else:
        assert plan["groups"][0]["spec"]["dtype"] == dtype
        assert page(plan) == row_page
    assert planned(cli, model, "--kv-dtype", value) == plan  # the old spelling


def test_fp8_halves_a_regular_model_and_doubles_its_capacity(cli: Run) -> None:
    bf16 = planned(cli, "llama-3-70b", "--gpu-mem", "40GiB", "--max-model-len", "32k")
    fp8 = planned(cli, "llama-3-70b", "--gpu-mem", "40GiB", "--max-model-len", "32k",
                  "--kv-cache-dtype", "fp8")
    assert fp8["num_blocks"] == 2 * bf16["num_blocks"]
    assert fp8["capacity"]["max_concurrency"] == 2 * bf16["capacity"]["max_concurrency"]


@pytest.mark.parametrize(
    ("model", "value", "fragment"),
    [
        ("deepseek-v3.2", "fp8_e5m2", "for a DeepSeek sparse-MLA cache, got 'fp8_e5m2'"),
        ("llama-3-8b", "fp8_ds_mla", "for a regular attention cache, got 'fp8_ds_mla'"),
        ("deepseek-v4-flash", "auto", "expected fp8_ds_mla, got bfloat16"),
    ],
)
def test_kv_cache_dtypes_a_model_cannot_take(
    cli: Run, model: str, value: str, fragment: str
) -> None:
    code, out, err = cli("plan", model, "--kv-cache-dtype", value)
    assert (code, out) == (2, "")
    assert fragment in err


def test_block_size(cli: Run) -> None:
    assert page(planned(cli, "llama-3-8b", "--block-size", "32")) == 32 * 4096


def test_max_num_seqs_caps_what_one_rank_serves(cli: Run) -> None:
    code, out, _ = cli("plan", "deepseek-v3.2", "--max-num-seqs", "4", "-dp", "2", "--plain")
    assert code == 0
    assert "per DP rank  4.00 = min(pools 10.48, --max-num-seqs 4)" in out
    assert "node         8.00 = 2 DP ranks x 4.00" in out


def test_max_num_batched_tokens(cli: Run) -> None:
    plan = planned(cli, "llama-3-8b", "--max-num-batched-tokens", "16384")
    assert plan["workload"]["max_num_batched_tokens"] == 16384


def test_gpu_memory_utilization_is_the_share_of_the_gpu(cli: Run) -> None:
    high = planned(cli, "llama-3-8b", "--gpu", "h200", "--gpu-memory-utilization", "0.9")
    low = planned(cli, "llama-3-8b", "--gpu", "h200", "--gpu-memory-utilization", "0.5")
    hbm = 143771 * 2**20
    gone = high["device_pools"][0]["available_bytes"] - low["device_pools"][0]["available_bytes"]
    assert gone == -(-hbm * 9 // 10) - -(-hbm * 5 // 10)


@pytest.mark.parametrize("flag", ["--kv-cache-memory-bytes", "--kv-cache-memory", "--gpu-mem"])
@pytest.mark.parametrize("size", ["10GiB", str(10 * GIB)])
def test_kv_cache_memory_bytes(cli: Run, flag: str, size: str) -> None:
    plan = planned(cli, "llama-3-8b", flag, size)
    assert plan["device_pools"][0]["available_bytes"] == 10 * GIB


def test_kv_cache_memory_bytes_overrides_the_gpu_estimate(cli: Run) -> None:
    plan = planned(cli, "llama-3-8b", "--gpu", "h100", "--kv-cache-memory-bytes", "10GiB")
    assert plan["device_pools"][0]["available_bytes"] == 10 * GIB


def test_num_gpu_blocks_override(cli: Run) -> None:
    plan = planned(cli, "llama-3-8b", "--num-gpu-blocks-override", "1000")
    assert plan["num_blocks"] == 1000
    assert plan["device_pools"][0]["num_blocks_override"] == 1000


@pytest.mark.parametrize("auto", ["auto", "-1"])
def test_max_model_len_auto_fits_a_regular_model(cli: Run, auto: str) -> None:
    plan = planned(cli, "llama-3-70b", "--gpu-mem", "10GiB", "--max-model-len", auto,
                   "--vllm", "0.33")
    assert plan["workload"]["max_model_len"] == 131072  # max_position_embeddings
    assert plan["fitted_max_model_len"] == 32752  # what 10 GiB holds, as the planner fits it


def test_max_model_len_auto_fits_a_hisparse_model(cli: Run) -> None:
    fitted = planned(cli, "deepseek-v3.2", "--host-pool", "2GiB", "--max-model-len", "auto")
    assert fitted["workload"]["max_model_len"] == 163840
    length = fitted["fitted_max_model_len"]
    assert 0 < length < 163840
    code, _, err = cli("plan", "deepseek-v3.2", "--host-pool", "2GiB",
                       "--max-model-len", str(length + 1))
    assert code == 2
    assert "host_pool_gib" in err


def test_max_model_len_auto_keeps_a_length_that_fits(cli: Run) -> None:
    auto = planned(cli, "deepseek-v3.2", "--max-model-len", "auto")
    fixed = planned(cli, "deepseek-v3.2")
    assert auto["fitted_max_model_len"] == 163840
    assert (auto["num_blocks"], auto["capacity"]) == (fixed["num_blocks"], fixed["capacity"])


def test_expert_parallel_splits_the_weights_over_dp(cli: Run) -> None:
    code, out, _ = cli("plan", "deepseek-v3.2", "--gpu", "h200", "-dp", "8",
                       "--enable-expert-parallel", "--plain")
    assert code == 0
    assert "weights (1/8 of the model)" in out
    assert "memory per rank (8 ranks: tp x dp x pp)" in out
    code, _, err = cli("plan", "deepseek-v3.2", "--gpu", "h200", "-dp", "8")
    assert code == 2
    assert "leaves no KV cache" in err


def test_help_shows_per_model_defaults(cli: Run) -> None:
    code, out, _ = cli("plan", "--help")
    assert code == 0
    flat = " ".join(out.split())
    assert "Default: per model (fp8_ds_mla for DeepSeek sparse MLA, auto otherwise)" in flat
    assert "Default: per model (64 for DeepSeek sparse MLA, vLLM's default for attention" in flat
    assert "(default fp8_ds_mla)" not in flat
    assert "(default 64)" not in flat
    for flag in ("-tp", "--tensor-parallel-size", "-pp", "--pipeline-parallel-size", "-dp",
                 "--data-parallel-size", "--kv-cache-dtype", "--max-num-seqs",
                 "--kv-cache-memory-bytes", "--num-gpu-blocks-override",
                 "--gpu-memory-utilization", "--max-num-batched-tokens", "--block-size"):
        assert f"{flag} " in flat or f"{flag}," in flat, flag


CLI_GUIDE = paths.REPO / "docs" / "cli.md"


def test_readme_vllm_serve_lines_and_their_plans() -> None:
    """Each `vllm serve` line of the CLI guide's table sits beside a `hisparse-plan` line with
    the same flags that plans."""
    from hisparse_plan.cli.main import main

    rows = re.findall(r"^\s*\| `(vllm serve [^`]+)` \| `(hisparse-plan [^`]+)` \|$",
                      CLI_GUIDE.read_text(encoding="utf-8"), flags=re.MULTILINE)
    assert len(rows) >= 3
    for serve, ours in rows:
        vllm_flags = {word for word in shlex.split(serve) if word.startswith("-")}
        our_flags = {word for word in shlex.split(ours) if word.startswith("-")}
        assert vllm_flags <= our_flags, (serve, ours)
        assert main([*shlex.split(ours)[1:], "--json"]) == 0, ours


def test_capacity_with_auto_compares_both_at_the_fitted_length(cli: Run) -> None:
    code, out, err = cli("capacity", "deepseek-v3.2", "--max-model-len", "auto",
                         "--host-pool", "4GiB", "--json")
    assert (code, err) == (0, ""), err
    comparison = json.loads(out)
    length = comparison["max_model_len"]
    assert 0 < length < 163840
    # the baseline is one group of the 122 MLA layers: ceil(L / 64) blocks at the same L
    assert comparison["baseline"]["blocks_per_request"] == -(-length // 64)
