"""SGLang 0.5.23's default mem_fraction_static for a model served multimodal: no prefill graphs
unless the architecture is listed as safe for them, then the fraction scaled by the vision
encoder's size (adjust_mem_fraction_for_vlm). Figures are SGLang's own, from its code through
references/sglang_reference.py on the case below (`sglang_diff.py --dump --cases ...` in the
SGLang 0.5.23 venv)."""

from __future__ import annotations

from typing import Any

import pytest

from hisparse_plan import PlanError, check_plan
from hisparse_plan.adapters.sglang import report, request_from_server_args
from hisparse_plan.models.sglang_settings import SGLangSettings
from hisparse_plan.targets.sglang import plan_sglang
from hisparse_plan.targets.sglang.served.hf_config import vision_encoder_size
from hisparse_plan.targets.sglang.served.multimodal import multimodal_fraction

H200 = {"total_memory_bytes": 150754820096, "name": "NVIDIA H200"}
MEMORY = {"pre_model_load_free_bytes": 149250113536, "post_weights_free_bytes": 120000000000}


def planned(model: str, **server_args: Any) -> tuple[float | None, dict[str, Any]]:
    request = request_from_server_args(
        f"tests/hf_configs/{model}/config.json",
        {"tp_size": 1, "context_length": 8192, **server_args}, MEMORY, gpu=H200)
    plan = plan_sglang(request)
    check_plan(plan, request=request)
    return plan.budget.mem_fraction_static, report(plan)


@pytest.mark.parametrize(("model", "server_args", "fraction", "tokens", "available"), [
    # Qwen2.5-VL: no prefill graphs (not listed), so 0.907 before the encoder's factor;
    # its vision_config has hidden_size 1280 and no num_hidden_layers (SGLang takes 24):
    # 0.907 x 0.95 x (1 - 0.1 x 0.5625).
    ("qwen2.5-vl-7b-instruct", {}, 0.8131821874999999, 1604571, 92012562673),
    # Text only: the plain rule, prefill graphs kept (0.903).
    ("qwen2.5-vl-7b-instruct", {"enable_multimodal": False}, 0.903, 1840170, 105522738987),
    # Gemma-3 serves text only by default; with --enable-multimodal its SigLIP encoder
    # (27 x 1152^2) scales the fraction.
    ("gemma-3-4b-it", {"enable_multimodal": True}, 0.825130849609375, 673511, 93795901850),
])
def test_multimodal_default_fraction_as_sglang_sizes_it(
    model: str, server_args: dict[str, Any], fraction: float, tokens: int, available: int,
) -> None:
    got_fraction, figures = planned(model, **server_args)
    assert (got_fraction, figures["max_total_num_tokens"], figures["available_bytes"]) == (
        fraction, tokens, available)


def test_the_encoder_factor_is_bounded() -> None:
    # Independent arithmetic: a tiny encoder is capped at 1.05, a huge one floored at 0.8.
    settings = SGLangSettings(name="sglang", context_length=8192, model_is_multimodal=True,
                              enable_multimodal=True, vision_encoder=(1, 64))
    assert multimodal_fraction(0.9, settings) == 0.9 * (0.95 * 1.05)
    huge = settings.model_copy(update={"vision_encoder": (96, 4096)})
    assert multimodal_fraction(0.9, huge) == 0.9 * (0.95 * 0.8)
    text_only = settings.model_copy(update={"enable_multimodal": False})
    assert multimodal_fraction(0.9, text_only) == 0.9


def test_vision_config_values_sglang_cannot_read_are_refused() -> None:
    assert vision_encoder_size({"vision_config": {"hidden_size": 1280}}) == (24, 1280)
    assert vision_encoder_size({}) is None
    with pytest.raises(PlanError, match="vision_config"):
        vision_encoder_size({"vision_config": {"hidden_size": "big"}})
