"""The deployment flags of the `hisparse-plan` command: the long-context guard, regular
presets, pipeline stages, hardware and speculative decoding."""

from __future__ import annotations

import json

import pytest

from support.cli_support import Run


def test_long_context_needs_the_allow_flag(cli: Run) -> None:
    code, out, err = cli("plan", "deepseek-v3.2", "--max-model-len", "200000")
    assert code == 2
    assert out == ""
    assert err.startswith("error: model.max_model_len: expected at most")
    assert "(163840), got 200000" in err
    assert len(err.splitlines()) == 1
    code, out, _ = cli("plan", "deepseek-v3.2", "--max-model-len", "200000",
                       "--allow-long-context", "--json")
    assert code == 0
    assert '"max_model_len": 200000' in out


def test_capacity_of_a_regular_model_is_its_own_plans(cli: Run) -> None:
    # Issue 28: capacity for regular models too. Llama-3-8B, bf16, 64-token blocks on 60 GiB:
    # 32 layers x (K, V) x 8 heads x 128 x 2 bytes x 64 tokens = 8 MiB a block, 7680 blocks;
    # a 4096-token request takes 64 of them.
    code, out, err = cli("capacity", "llama-3-8b", "--max-model-len", "4096", "--json")
    assert code == 0, err
    found = json.loads(out)
    assert (found["num_blocks"], found["bytes_per_block"]) == (7680, 8 * 2**20)
    assert (found["blocks_per_request"], found["max_model_len"]) == (64, 4096)
    assert found["max_concurrency"] == 7680 / 64
    code, out, err = cli("capacity", "llama-3-8b", "--max-model-len", "4096", "-dp", "4",
                         "--plain")
    assert code == 0, err
    assert "node  480.00 = 4 DP ranks x 120.00" in out


def test_capacity_reports_the_planned_baseline(cli: Run) -> None:
    code, out, err = cli("capacity", "deepseek-v3.2", "--plain")
    assert code == 0, err
    assert ("baseline (planned without HiSparse): 20941 blocks of 3076352 bytes, 2560 blocks "
            "per request") in out


@pytest.mark.parametrize("argv", [["--target", "3"], ["--dram", "512GiB"]])
def test_tune_of_a_regular_model_is_refused_clearly(cli: Run, argv: list[str]) -> None:
    code, out, err = cli("tune", "gemma-3-27b", *argv)
    assert code == 2
    assert out == ""
    assert "expected a request with hisparse settings, got a regular one" in err


def test_models_json_lists_every_preset_with_its_source_and_weights(cli: Run) -> None:
    code, out, err = cli("models", "--json")
    assert code == 0, err
    listed = json.loads(out)
    assert listed["gemma-3-27b"]["kind"] == "regular"
    assert listed["deepseek-v3.2"]["kind"] == "sparse_mla"
    assert listed["qwen3-next-80b"]["config"]["full_attention_interval"] == 4
    assert all(entry["source"] for entry in listed.values())
    assert listed["llama-3-8b"]["weights"]["parameters"] == 8_030_000_000
