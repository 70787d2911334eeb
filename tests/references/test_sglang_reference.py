"""SGLang 0.5.23's own reports (references/sglang_reference.py) against hand-checked numbers.

Needs SGLang: run in its venv, e.g.
``PYTHONPATH=references/sglang_stubs:references:tests:src /work/sglang/bin/python -m pytest
-q tests/references/test_sglang_reference.py``.  Elsewhere the whole module skips.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

from support import paths

if importlib.util.find_spec("sglang") is None:
    pytest.skip(
        "sglang is not importable here: these tests read SGLang 0.5.23's own pool objects "
        "(run them in the SGLang venv)",
        allow_module_level=True,
    )

REFERENCES = paths.REPO / "references"
sys.path.insert(0, str(REFERENCES))
reference: Any = importlib.import_module("sglang_reference")

GIB = 1 << 30
DSV32 = "tests/hf_configs/deepseek-v3.2-exp/config.json"


def _report(case: dict[str, Any]) -> dict[str, Any]:
    report: dict[str, Any] = reference.run_case(case)
    return report


def _pool(report: dict[str, Any], name: str) -> dict[str, Any]:
    pools = {p["name"]: p for p in report["pools"]}
    assert name in pools, f"pool {name!r} missing; got {sorted(pools)}"
    pool: dict[str, Any] = pools[name]
    return pool


def test_mha_rows_are_size_plus_one_page_and_k_v_share_an_allocation() -> None:
    # 1 GiB / (2 layers * 8 heads * 256 values * 2 B = 8192 B) = 131072 tokens, page 64.
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 1024,
        "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 8,
        "head_dim": 128, "intermediate_size": 2048, "vocab_size": 32000,
        "max_position_embeddings": 4096, "torch_dtype": "bfloat16",
    }
    report = _report({"config": config,
                      "server_args": {"tp_size": 1, "page_size": 64, "max_total_tokens": 1024},
                      "memory": {"available_bytes": GIB}})
    assert report["cell_size_bytes"] == 8192
    assert report["max_total_num_tokens"] == 1024
    k, v = _pool(report, "kv")["buffers"][:2]
    assert (k["name"], v["name"]) == ("k_buffer", "v_buffer")
    assert k["shape"] == [1088, 8, 128]
    assert k["strides"] == [1024, 128, 1]
    assert v["storage_offset"] == 1088 * 1024
    assert k["storage"] == v["storage"]
    assert k["storage_nbytes"] == 4_456_448


def test_dsa_rows_index_pages_and_cell_size() -> None:
    report = _report({
        "config": DSV32,
        "server_args": {"tp_size": 1, "context_length": 4096, "kv_cache_dtype": "fp8_e4m3",
                        "dsa_backend": "flashmla_kv", "max_total_tokens": 1024},
        "memory": {"available_bytes": 2 * GIB},
    })
    assert report["page_size"] == 64
    assert report["cell_size_bytes"] == 48_068  # 61 layers * (656 + 132)
    assert report["max_total_num_tokens"] == 1024
    kv = _pool(report, "kv")["buffers"][0]
    assert kv["shape"] == [1088, 1, 656]
    assert kv["dtype"] == "uint8"
    index = _pool(report, "index")["buffers"][0]
    assert index["shape"] == [17, 8448]
    assert index["dtype"] == "uint8"
    assert len(_pool(report, "kv")["buffers"]) == 61
    assert report["req_to_token"] == {"shape": [report["max_running_requests"] + 1, 4100],
                                      "dtype": "int32"}


def test_budget_arithmetic_is_sglang_float_order() -> None:
    pre, post = 139 * GIB, 137 * GIB
    report = _report({
        "config": "tests/hf_configs/llama-3.1-8b-instruct/config.json",
        "server_args": {"tp_size": 8, "context_length": 8192, "mem_fraction_static": 0.9},
        "memory": {"pre_model_load_free_bytes": pre, "post_weights_free_bytes": post},
    })
    expected = int((post / GIB - pre / GIB * (1 - 0.9)) * (1 << 30))
    assert report["available_bytes"] == expected == 132_177_618_534
    assert report["cell_size_bytes"] == 16_384  # 1 kv head/rank * 256 * 2 B * 32 layers
    assert report["max_total_num_tokens"] == expected // 16_384


def test_hisparse_index_covers_host_tokens_and_host_pool_is_layer_first() -> None:
    report = _report({
        "config": DSV32,
        "server_args": {"tp_size": 1, "context_length": 4096, "kv_cache_dtype": "fp8_e4m3",
                        "dsa_backend": "flashmla_kv", "enable_hisparse": True,
                        "max_total_tokens": 1024,
                        "hisparse_config": {"top_k": 2048, "host_to_device_ratio": 4}},
        "memory": {"available_bytes": 2 * GIB},
    })
    assert report["cell_size_bytes"] == 61 * (656 + 4 * 132)
    assert _pool(report, "index")["buffers"][0]["shape"] == [65, 8448]
    host = _pool(report, "hisparse_host")
    assert host["location"] == "host"
    assert host["tokens"] == 4160
    assert host["buffers"][0]["shape"] == [61, 4160, 1, 656]


@pytest.mark.parametrize("case", ["dsv32_tp8_hisparse", "gptoss120b_tp1_small",
                                  "qwen3next_tp1_small"])
def test_a_request_from_sglangs_own_server_args_plans_what_sglang_allocates(
    case: str, tmp_path: Path
) -> None:
    """SGLang's resolved ServerArgs object, read by `request_from_sglang`, plans to SGLang's
    own report."""
    import json

    from hisparse_plan.adapters.sglang import report, request_from_sglang
    from hisparse_plan.targets.sglang import plan_sglang

    data = json.loads((REFERENCES / "sglang_cases" / f"{case}.json").read_text())
    config = reference._load_config(data["config"])
    model_dir = reference._write_model_dir(config, tmp_path)
    server_args = reference._resolve(data, model_dir, [])
    ours = report(plan_sglang(request_from_sglang(server_args, data["memory"],
                                                  gpu=data.get("gpu"))))
    theirs = _report(data)
    assert {k: ours[k] for k in ("page_size", "max_total_num_tokens", "max_running_requests",
                                 "pools")} == {k: theirs[k] for k in ("page_size",
                                                                      "max_total_num_tokens",
                                                                      "max_running_requests",
                                                                      "pools")}


@pytest.mark.parametrize(("radix_off", "window"), [(False, 882636), (True, 39345)])
def test_a_window_draft_gets_its_own_swa_pool_on_the_targets_tokens(
    radix_off: bool, window: int
) -> None:
    """gpt-oss-20b drafting with its own checkpoint: the draft worker's configurator builds a
    SWAKVPool (its 12 window layers over the target's window tokens, its 12 full layers over
    the full tokens), sharing the target's allocator and request table; the target's cell
    prices the draft's window layers at the ratio: 24 x 2048 + 0.8 x 24 x 2048 bytes."""
    import json

    data = json.loads((REFERENCES / "sglang_cases" / "gptoss20b_eagle_self.json").read_text())
    data["server_args"]["disable_radix_cache"] = radix_off
    report = _report(data)
    assert report["draft"]["token_to_kv_pool"] == "SWAKVPool"
    assert report["cell_size_bytes"] == 88473.6
    assert not [note for note in report["notes"] if note.startswith("draft: its")]
    target = {p["name"]: p for p in report["pools"]}
    draft = {p["name"]: p for p in report["draft_pools"]}
    assert target["swa"]["tokens"] == draft["swa"]["tokens"] == window
    assert target["kv"]["tokens"] == draft["kv"]["tokens"]
    layers = {name: sorted({b["layer"] for b in pool["buffers"]}) for name, pool in draft.items()}
    assert layers == {"kv": list(range(1, 24, 2)), "swa": list(range(0, 24, 2))}
