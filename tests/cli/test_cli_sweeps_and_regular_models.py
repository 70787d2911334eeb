"""The smaller faults of issue 17, each shown fixed: a sweep past max_position_embeddings, a
sweep of a regular model, verify's advice for a plan without a host pool, explain's model
section for regular models, llama-4-scout's defaults, and --tp on a regular request file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import hisparse_plan as hp
from hisparse_plan.operator import sweep
from hisparse_plan.presets import ConfigError, build_request, load_preset
from hisparse_plan.presets.settings import Settings
from support.cli_support import Run
from support.golden import GOLDEN


def one_error_line(code: int, out: str, err: str) -> str:
    assert (code, out) == (2, "")
    lines = err.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("error: ")
    return lines[0]


def test_sweep_points_past_max_position_embeddings_need_the_allow_flag(cli: Run) -> None:
    line = one_error_line(*cli("capacity", "deepseek-v3.2", "--sweep", "max-model-len",
                               "--points", "64k,256k"))
    assert "max_position_embeddings (163840), got 262144" in line
    assert "--allow-long-context" in line
    code, out, _ = cli("capacity", "deepseek-v3.2", "--sweep", "max-model-len", "--points",
                       "64k,256k", "--allow-long-context", "--json")
    assert code == 0
    assert [point["value"] for point in json.loads(out)["points"]] == [65536, 262144]


def test_library_sweep_refuses_a_length_past_the_model(cli: Run) -> None:
    arch = load_preset("deepseek-v3.2").architecture
    request = build_request(arch, Settings(max_model_len=8192))
    with pytest.raises(ConfigError, match="max_position_embeddings"):
        sweep(request, "max-model-len", [8192, 200_000],
              max_position_embeddings=arch.max_position_embeddings)
    kept = sweep(request, "max-model-len", [200_000],
                 max_position_embeddings=arch.max_position_embeddings, allow_long_context=True)
    assert kept.points[0].comparison is not None


def test_sweep_of_a_regular_model_gives_its_own_rows_and_one_refusal_for_host_pool(
    cli: Run,
) -> None:
    # Issue 28: a regular model's capacity is its own plan's. Llama-3-8B in bf16 on the default
    # 60 GiB: a 64-token block of 32 layers x K and V x 8 heads x 128 x 2 bytes is 8 MiB, so
    # 7680 blocks, and a request of L tokens takes ceil(L / 64) of them.
    code, out, err = cli("capacity", "llama-3-8b", "--sweep", "max-model-len", "--points",
                         "2k,4k,8k", "--json")
    assert code == 0, err
    points = json.loads(out)["points"]
    assert [p["regular"]["max_concurrency"] for p in points] == [
        7680 / -(-length // 64) for length in (2048, 4096, 8192)]
    assert all(p["comparison"] is None for p in points)
    line = one_error_line(*cli("capacity", "llama-3-8b", "--sweep", "host-pool"))
    assert "no host pool" in line
    assert "--sweep max-model-len" in line


def test_capacity_of_a_regular_request_with_tp_names_no_host_pool(cli: Run) -> None:
    request = str(GOLDEN / "regular_llama3_8b_bf16.request.json")
    code, out, err = cli("capacity", "--request", request, "--tp", "8", "--plain")
    assert code == 0, err
    assert "host" not in out
    # The golden plan: 30720 blocks, 512 a request (8192 tokens in 16-token blocks).
    assert "60.00             512   30720" in out
    code, out, _ = cli("plan", "--request", request, "--tp", "8", "--json")
    assert code == 0
    assert json.loads(out)["host_pool"] is None


def test_verify_of_a_plan_without_host_pool_does_not_advise_a_host_pool(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("torch")
    from hisparse_plan.torch import HostMemory, HostMemoryError, allocate
    from hisparse_plan.torch.vllm import pools as pools_module

    plan = hp.plan(build_request(load_preset("llama-3-8b").architecture,
                                 Settings(gpu_mem_bytes=2 * 2**30)))
    assert plan.host_pool is None
    monkeypatch.setattr(pools_module, "available_host_memory",
                        lambda: HostMemory(2**20, "MemAvailable (test)"))
    with pytest.raises(HostMemoryError) as caught:
        allocate(plan, device="cpu", pin=False)
    message = str(caught.value)
    assert "host_pool_gib" not in message
    assert "--gpu-mem" in message


def test_explain_has_a_model_section_for_regular_models(cli: Run) -> None:
    code, out, err = cli("explain", "llama-3-8b", "--section", "model", "--json")
    assert (code, err) == (0, "")
    sections = json.loads(out)["sections"]
    assert [s["title"] for s in sections] == ["model config (config.json fields)"]
    steps = {step["name"]: step["value"] for step in sections[0]["steps"]}
    assert steps["layers"] == 32
    assert steps["token bytes (bfloat16)"] == 2 * 8 * 128 * 2
    assert steps["attention page bytes"] == 64 * 4096  # vLLM 0.34's 64-token blocks
    assert steps["max_model_len"] == 8192


def test_llama_4_scout_plans_on_its_defaults(cli: Run) -> None:
    code, out, err = cli("plan", "llama-4-scout", "--plain")
    assert (code, err) == (0, "")
    assert "(auto-fit from 10485760)" in out.splitlines()[0]
    code, out, _ = cli("plan", "llama-4-scout", "--json")
    fitted = json.loads(out)["fitted_max_model_len"]
    assert 0 < fitted < 10485760
    code, _, err = cli("plan", "llama-4-scout", "--max-model-len", str(fitted + 1))
    assert code == 2
    assert "see docs/planning-rules.md#admission" in err
    code, out, _ = cli("plan", "llama-4-scout", "--max-model-len", "131072", "--json")
    assert code == 0
    assert json.loads(out)["fitted_max_model_len"] is None


def test_every_preset_plans_on_its_defaults(cli: Run) -> None:
    for name in hp.presets.preset_names():
        code, _, err = cli("plan", name, "--json")
        assert (code, err) == (0, ""), name


def test_request_file_keeps_its_cache_dtype(cli: Run, tmp_path: Path) -> None:
    request = str(GOLDEN / "regular_llama3_8b_bf16.request.json")
    line = one_error_line(*cli("plan", "--request", request, "--kv-cache-dtype", "fp8"))
    assert "kv_dtype shapes the layers" in line
