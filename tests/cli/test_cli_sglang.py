"""`plan --engine sglang` and `capacity --engine vllm,sglang`: SGLang's pools for presets and
config.json files, the two engines side by side, and flags given to the wrong engine."""

from __future__ import annotations

import json

import pytest

from hisparse_plan.models.sglang_plan import SGLangPlan
from support import paths
from support.cli_support import Run

CONFIGS = paths.HF_CONFIGS
QWEN_NEXT = str(CONFIGS / "qwen3-next-80b-a3b-instruct" / "config.json")
LLAMA_31 = str(CONFIGS / "llama-3.1-8b-instruct" / "config.json")


def planned(cli: Run, *argv: str) -> SGLangPlan:
    code, out, err = cli("plan", *argv, "--engine", "sglang", "--json")
    assert (code, err) == (0, ""), err
    return SGLangPlan.model_validate_json(out)




def test_deepseek_v32_plan_json(cli: Run) -> None:
    plan = planned(cli, "deepseek-v3.2", "--gpu", "h200", "-tp", "8", "--kv-cache-dtype", "fp8",
                   "--context-length", "8192")
    assert plan.engine == "sglang"
    assert plan.page_size == 64
    assert plan.budget.cell_size_bytes == 48068
    assert plan.budget.mem_fraction_static == 0.886  # SGLang's rule for an H200, MLA, tp 8
    assert {p.name for p in plan.pools} == {"kv", "index"}
    kv = next(t for t in plan.tensors if t.pool == "kv")
    assert kv.views[0].shape[1:] == [1, 656]
    assert plan.hisparse is None


def test_deepseek_v32_hisparse(cli: Run) -> None:
    plan = planned(cli, "deepseek-v3.2", "--gpu", "h200", "-tp", "8", "--kv-cache-dtype", "fp8",
                   "--enable-hisparse", "--hisparse-config", '{"host_to_device_ratio": 4}')
    assert plan.hisparse is not None
    assert plan.hisparse.host_to_device_ratio == 4
    assert plan.budget.cell_size_bytes == 61 * (656 + 4 * 132)
    assert any(p.location == "host" for p in plan.pools)


def test_deepseek_v32_default_dtype_is_sglangs_bfloat16(cli: Run) -> None:
    plan = planned(cli, "deepseek-v3.2", "--gpu-mem", "40GiB")
    kv = next(t for t in plan.tensors if t.pool == "kv")
    assert (kv.views[0].dtype, kv.views[0].shape[2]) == ("bfloat16", 576)


def test_human_view_lists_pools_and_buffers(cli: Run) -> None:
    code, out, err = cli("plan", "deepseek-v3.2", "--engine", "sglang", "--gpu", "h200", "-tp",
                         "8", "--kv-cache-dtype", "fp8", "--enable-hisparse", "--plain")
    assert (code, err) == (0, ""), err
    for text in ("kv_buffer", "index_k", "host_kv_buffer", "hisparse_host", "uint8",
                 "max_total_num_tokens", "HiSparse host pool", "mem_fraction_static 0.886"):
        assert text in out


def test_llama_presets_and_config_file(cli: Run) -> None:
    plan = planned(cli, "llama-3-8b", "--gpu-mem", "8GiB", "--context-length", "8192")
    assert (plan.page_size, plan.budget.available_bytes) == (1, 8 * 2**30)
    assert plan.budget.cell_size_bytes == 32 * 2 * 8 * 128 * 2
    paged = planned(cli, "--hf-config", LLAMA_31, "-tp", "8", "--gpu-mem", "8GiB",
                    "--page-size", "16", "--max-running-requests", "64")
    assert (paged.page_size, paged.max_running_requests) == (16, 64)


def test_gpt_oss_window_pools(cli: Run) -> None:
    plan = planned(cli, "gpt-oss-120b", "--gpu-mem", "4GiB", "--swa-full-tokens-ratio", "0.5",
                   "--context-length", "4096")
    assert {p.name for p in plan.pools} == {"kv", "swa"}
    assert isinstance(plan.budget.cell_size_bytes, float)


def test_qwen3_next_mamba_pools(cli: Run) -> None:
    plan = planned(cli, "--hf-config", QWEN_NEXT, "--gpu-mem", "4GiB", "--context-length",
                   "4096", "--max-mamba-cache-size", "30")
    assert {p.name for p in plan.pools} == {"kv", "mamba_conv0", "mamba_temporal"}
    code, out, err = cli("plan", "--hf-config", QWEN_NEXT, "--engine", "sglang", "--gpu-mem",
                         "4GiB", "--context-length", "4096", "--plain")
    assert code == 0, err
    assert "temporal" in out


def test_sglang_server_modes_under_sglangs_flag_names(cli: Run) -> None:
    # DeepSeek-V3.2 on 8 H200s as SGLang documents it: --tp 8 --dp 8 --enable-dp-attention.
    # SGLang's default fraction keeps DP attention's graph padding back (0.758, as SGLang
    # resolves references/sglang_cases/dsv32_tp8_h200_default_fraction.json with DP 8), and
    # a given --max-running-requests is shared by the 8 groups.
    plain = planned(cli, "deepseek-v3.2", "--gpu", "h200", "-tp", "8", "--kv-cache-dtype",
                    "fp8", "--context-length", "8192")
    dp = planned(cli, "deepseek-v3.2", "--gpu", "h200", "-tp", "8", "--kv-cache-dtype", "fp8",
                 "--context-length", "8192", "--enable-dp-attention",
                 "--dp-size", "8", "--max-running-requests", "800")
    assert dp.max_running_requests == 100
    assert (plain.budget.mem_fraction_static, dp.budget.mem_fraction_static) == (0.886, 0.758)
    assert dp.max_total_num_tokens < plain.max_total_num_tokens
    deepep = planned(cli, "deepseek-v3.2", "--gpu", "h200", "-tp", "8", "--kv-cache-dtype",
                     "fp8", "--context-length", "8192", "--moe-a2a-backend",
                     "deepep")
    assert deepep.budget.mem_fraction_static == 0.865  # 3 GiB more kept back than 0.886
    off = planned(cli, "--hf-config", QWEN_NEXT, "--gpu-mem", "4GiB", "--context-length",
                  "4096", "--disable-radix-cache", "--max-running-requests", "16")
    assert off.max_running_requests == 16
    assert off.budget.mamba_slots_per_request == 1
    slots = next(p for p in off.pools if p.name == "mamba_conv0")
    assert slots.num_blocks == 16 + 1
    dcp = planned(cli, "deepseek-v3.2", "--gpu-mem", "8GiB", "-tp", "8", "--kv-cache-dtype",
                  "fp8", "--context-length", "8192", "--dcp-size", "8")
    assert dcp.budget.dcp_size == 8
    # DCP sets the unset DSA backends to trtllm (raw 576-byte fp8 rows), the index keys
    # charged dcp_size times.
    assert dcp.budget.cell_size_bytes == 61 * (576 + 8 * 132)


def test_capacity_side_by_side(cli: Run) -> None:
    code, out, err = cli("capacity", "deepseek-v3.2", "--engine", "vllm,sglang", "--gpu", "h200",
                         "-tp", "8", "--kv-cache-dtype", "fp8", "--plain")
    assert (code, err) == (0, ""), err
    assert "vLLM" in out
    assert "SGLang" in out
    for label in ("tokens in the device pools", "bytes per token", "max concurrent requests",
                  "request slots", "host pool"):
        assert label in out
    # The same question: vLLM plans DeepSeek-V3.2 with HiSparse by default, so SGLang does too.
    assert "56120" in out
    assert "planned with HiSparse as vLLM is" in out
    code, out, err = cli("capacity", "deepseek-v3.2", "--engine", "vllm,sglang", "--gpu", "h200",
                         "-tp", "8", "--kv-cache-dtype", "fp8", "--no-hisparse", "--plain")
    assert (code, err) == (0, ""), err
    assert "48068" in out
    assert "planned with" not in out
    code, out, err = cli("capacity", "deepseek-v3.2", "--engine", "vllm,sglang", "--gpu", "h200",
                         "-tp", "8", "--plain")
    assert (code, err) == (0, ""), err
    assert "planned with fp8 rows and HiSparse as vLLM is" in out
    code, out, err = cli("capacity", "deepseek-v3.2", "--engine", "vllm,sglang", "--gpu", "h200",
                         "-tp", "8", "--kv-cache-dtype", "fp8", "--enable-hisparse", "--json")
    assert code == 0, err
    vllm, sglang = json.loads(out)
    assert (vllm["engine"], sglang["engine"]) == ("vllm", "sglang")
    assert vllm["host_bytes"] > 0
    assert sglang["host_bytes"] > 0
    assert sglang["bytes_per_token"] == 56120


def test_capacity_one_engine(cli: Run) -> None:
    code, out, err = cli("capacity", "llama-3-8b", "--engine", "sglang", "--gpu-mem", "8GiB",
                         "--json")
    assert code == 0, err
    (only,) = json.loads(out)
    assert only["engine"] == "sglang"
    assert only["request_slots"] >= 1


@pytest.mark.parametrize(("argv", "words"), [
    (["plan", "llama-3-8b", "--engine", "sglang", "--block-size", "16"],
     "--block-size applies to vLLM only"),
    (["plan", "llama-3-8b", "--page-size", "16"], "--page-size applies to SGLang 0.5.23 only"),
    (["capacity", "llama-3-8b", "--engine", "vllm", "--enable-hisparse"],
     "--enable-hisparse applies to SGLang"),
    (["capacity", "llama-3-8b", "--engine", "sglang", "--host-pool", "8GiB"],
     "--host-pool applies to vLLM"),
    (["plan", "llama-3-8b", "--engine", "vllm,sglang"], "expected vllm or sglang"),
    (["plan", "llama-3-8b", "--engine", "trt"], "expected engines from vllm, sglang"),
    (["plan", "llama-3-8b", "--engine", "sglang", "--mem-fraction-static", "0.9"],
     "--mem-fraction-static needs --gpu"),
    (["plan", "llama-3-8b", "--engine", "sglang", "--mem-fraction-static", "1.5"],
     "expected a number between 0 and 1"),
    (["plan", "llama-3-8b", "--engine", "sglang", "--context-length", "8192",
      "--max-model-len", "8192"], "expected one of them"),
    (["plan", "llama-3-8b", "--engine", "sglang", "--hisparse-config", "{}"],
     "--hisparse-config needs --enable-hisparse"),
    (["plan", "deepseek-v3.2", "--engine", "sglang", "--enable-hisparse", "--hisparse-config",
      "[1]"], "hisparse_config: expected a JSON object"),
    (["plan", "llama-3-8b", "--engine", "sglang", "--enable-hisparse"], "engine.enable_hisparse"),
    (["plan", "deepseek-v3.2", "--engine", "sglang", "-tp", "8", "--enable-dp-attention",
      "--dp-size", "3"], "expected a divisor of 8, got 3"),
    (["plan", "llama-3-8b", "--engine", "vllm", "--disable-radix-cache"],
     "--disable-radix-cache applies to SGLang"),
])
def test_flag_errors(cli: Run, argv: list[str], words: str) -> None:
    code, out, err = cli(*argv)
    assert code == 2
    assert out == ""
    assert words in err
    assert "Traceback" not in err


def test_capacity_counts_the_request_table_and_hisparse_beside_the_budget(cli: Run) -> None:
    code, out, err = cli("capacity", "deepseek-v3.2", "--engine", "vllm,sglang", "--gpu", "h200",
                         "-tp", "8", "--kv-cache-dtype", "fp8", "--context-length", "8192",
                         "--json")
    assert code == 0, err
    vllm, sglang = json.loads(out)
    assert vllm["beside_pools_bytes"] is None
    # int32 [max_running_requests + 1, 8192 + 4], and HiSparse's device tables (61 layers, a
    # 4096-row buffer, pages of 64, top-k 2048, host_to_device_ratio 2)
    rows, width = sglang["request_slots"] + 1, 8192 + 4
    layers, hot, page, top_k = 61, 4096, 64, 2048
    tokens = sglang["device_tokens"]
    coordinator = (rows * (hot + page) * 8 + rows * (width + page) * 8
                   + 2 * layers * rows * (hot + page) * 4 + layers * rows * hot * 2
                   + hot * 2 + hot * 4 + 2 * rows * top_k * 4 + 4)
    allocator = (2 * tokens + page + 1) * 8 + tokens // page * 8 + 2 * tokens // page * 8
    assert sglang["beside_pools_bytes"] == (rows * width * 4 + coordinator + layers * 8
                                            + allocator)
    # the host pool's slot tables (int64 + uint8 + bool a host token), two int64 per slot
    host_tokens = (2 * tokens // page + 1) * page
    assert sglang["beside_pools_host_bytes"] == host_tokens * 10 + rows * 16
    code, out, err = cli("capacity", "deepseek-v3.2", "--engine", "vllm,sglang", "--gpu", "h200",
                         "-tp", "8", "--kv-cache-dtype", "fp8", "--plain")
    assert code == 0, err
    assert "beside the budget" in out
