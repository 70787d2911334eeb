"""SGLang's default mem_fraction_static for a model served multimodally: the rule's fraction
with no prefill graphs (off for multimodal models outside SGLang's allowlist), times its vision
encoder factor (memory_hook.adjust_mem_fraction_for_vlm). The figures are SGLang 0.5.23's own,
computed by the reference harness on the cases below (`python benchmarks/sglang_diff.py
--cases ...` agrees on every buffer); SGLang is not imported here."""

from __future__ import annotations

import pytest

from hisparse_plan.adapters.sglang import request_from_server_args
from hisparse_plan.targets.sglang import plan_sglang

H200 = {"total_memory_bytes": 150_754_820_096, "name": "NVIDIA H200"}
MEMORY = {"pre_model_load_free_bytes": 148_607_336_448, "post_weights_free_bytes": 120_000_000_000}


@pytest.mark.parametrize(
    ("model", "server_args", "fraction"),
    [
        # ViT of 24 (unnamed) x 1280: factor 0.95 x (1 - 0.1 x 0.5625); no prefill graphs.
        ("qwen2.5-vl-7b-instruct", {"tp_size": 4}, 0.8069062499999999),
        # Gemma-3 serves text only unless asked; asked, its 27 x 1152 ViT moves the fraction.
        ("gemma-3-27b-it", {"tp_size": 4, "enable_multimodal": True}, 0.8187626953125),
        ("gemma-3-27b-it", {"tp_size": 4}, 0.897),
        # Qwen3.5 is allowlisted for prefill graphs; its 24 x 1152 ViT moves the fraction.
        ("qwen3.5-35b-a3b", {"tp_size": 1, "moe_a2a_backend": "deepep"}, 0.816568046875),
    ],
)
def test_default_fraction_of_a_multimodal_model(
    model: str, server_args: dict[str, object], fraction: float
) -> None:
    request = request_from_server_args(f"tests/hf_configs/{model}/config.json",
                                       {"context_length": 4096, **server_args}, MEMORY, gpu=H200)
    assert plan_sglang(request).budget.mem_fraction_static == fraction
