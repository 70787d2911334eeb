"""SGLang 0.5.23's default mem_fraction_static for DeepSeek-V4: the same rule as any MLA model,
without the prefill graphs SGLang turns off for V4 (cuda_graph_hook's breakable-graph
blockers). Every figure is SGLang's own, computed by its code through
references/sglang_reference.py (`run_case_safely` and `memory_defaults` on the case below, in
the SGLang 0.5.23 venv with references/sglang_stubs on PYTHONPATH)."""

from __future__ import annotations

from typing import Any

import pytest

from hisparse_plan import check_plan
from hisparse_plan.adapters.sglang import report, request_from_server_args
from hisparse_plan.targets.sglang import plan_sglang

V4 = "references/sglang_cases/deepseek_v4_flash_config.json"
H200 = {"total_memory_bytes": 150754820096, "name": "NVIDIA H200"}
B200 = {"total_memory_bytes": 183359 << 20, "name": "NVIDIA B200", "capability": [10, 0]}
MEMORY = {"pre_model_load_free_bytes": 149250113536, "post_weights_free_bytes": 110000000000}


def case(gpu: dict[str, Any], **server_args: Any) -> dict[str, Any]:
    return {"config": V4, "server_args": {"tp_size": 8, "context_length": 8192, **server_args},
            "memory": MEMORY, "gpu": gpu}


@pytest.mark.parametrize(("gpu", "server_args", "fraction", "tokens", "requests", "available"), [
    # SGLang: fraction 0.897 (DeepSeek-V3.2's rule gives 0.886: its 1536 MiB of MLA prefill
    # graphs are the difference).
    (H200, {}, 0.897, 12969472, 256, 94627238305),
    # DP attention 8: 0.769 (DeepSeek-V3.2: 0.758); V4's 256 requests shared by 8 groups.
    (H200, {"enable_dp_attention": True, "dp_size": 8}, 0.769, 10605056, 32, 75523223773),
    # B200: 0.852 (DeepSeek-V3.2: 0.844).
    (B200, {}, 0.852, 12021504, 256, 87910983196),
])
def test_deepseek_v4_default_fraction_as_sglang_sizes_it(
    gpu: dict[str, Any], server_args: dict[str, Any], fraction: float, tokens: int,
    requests: int, available: int,
) -> None:
    given = case(gpu, **server_args)
    request = request_from_server_args(given["config"], given["server_args"], given["memory"],
                                       gpu=given["gpu"])
    plan = plan_sglang(request)
    check_plan(plan, request=request)
    figures = report(plan)
    assert (plan.budget.mem_fraction_static, figures["max_total_num_tokens"],
            figures["max_running_requests"], figures["available_bytes"]) == (
        fraction, tokens, requests, available)


def test_a_given_fraction_is_kept() -> None:
    given = case(H200, mem_fraction_static=0.8)
    plan = plan_sglang(request_from_server_args(given["config"], given["server_args"],
                                                given["memory"], gpu=given["gpu"]))
    assert plan.budget.mem_fraction_static == 0.8
