"""vLLM 0.34's attention backends and KV-cache layout on each CUDA compute capability, as the
vLLM target resolves them, against vLLM's own selection and resolution run on CPU with a
capability stand-in (`references/vllm_backends.py`, pinned in `vllm_backends_cases.json`):
one deployment per attention kind, no layout and each of the six `VLLM_KV_CACHE_LAYOUT`
values, and a few `--attention-backend` choices."""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import pytest

from hisparse_plan.errors import UnsupportedRequestError
from hisparse_plan.models import KVCacheLayout, PlanRequest
from hisparse_plan.presets import Settings, build_request, load_config_file, load_preset
from hisparse_plan.targets.vllm.platform import Platform, resolve_platform
from support import paths

HERE = paths.TESTS
CASES: list[dict[str, Any]] = [
    {**case, "flashinfer": pinned["flashinfer"]}
    for file in ("vllm_backends_cases.json", "vllm_backends_cases_no_flashinfer.json")
    for pinned in [json.loads((HERE / file).read_text())] for case in pinned["cases"]]
"""With FlashInfer installed (vLLM's CUDA wheel) and without (`--no-flashinfer`)."""

DEPLOYMENTS: dict[str, tuple[str, Settings, dict[str, Any]]] = {
    "llama-3.1-8b": ("llama-3-8b", Settings(), {}),
    "llama-3.1-8b-fp8": ("llama-3-8b", Settings(kv_dtype="fp8_e4m3"), {}),
    "gemma-3-27b": ("gemma-3-27b", Settings(), {}),
    "gpt-oss-120b": ("gpt-oss-120b", Settings(), {"sinks": True}),
    "deepseek-v3.2": ("deepseek-v3.2", Settings(hisparse=False), {"num_heads": 128}),
    "deepseek-v3.2-hisparse": ("deepseek-v3.2", Settings(), {"num_heads": 128}),
    "deepseek-v3.2-bf16": ("deepseek-v3.2", Settings(hisparse=False, kv_dtype="bfloat16"),
                           {"num_heads": 128}),
    "glm-5": ("glm-5", Settings(hisparse=False), {"num_heads": 64}),
    "glm-5-hisparse": ("glm-5", Settings(), {"num_heads": 64}),
    "deepseek-v4-flash": ("deepseek-v4-flash", Settings(), {}),
    "kimi-k2": ("hf_configs/kimi-k2-instruct/config.json", Settings(), {"num_heads": 64}),
}
"""The harness's deployments as this project builds them (Llama-3-8B has Llama-3.1-8B's
attention layers; Kimi-K2 is read from its config.json)."""


@cache
def request_for(name: str) -> PlanRequest:
    model, settings, _ = DEPLOYMENTS[name]
    arch = (load_config_file(HERE / model, use_transformers=False) if model.endswith(".json")
            else load_preset(model).architecture)
    return build_request(arch, settings)


def ours(case: dict[str, Any]) -> dict[str, Any]:
    """The target's answer in the harness's terms."""
    name = case["deployment"]
    major, minor = (int(part) for part in case["capability"].split("."))
    platform = Platform((major, minor), attention_backend=case["attention_backend"],
                        flashinfer=case["flashinfer"])
    layout = None if case["layout"] is None else KVCacheLayout(case["layout"])
    try:
        resolution = resolve_platform(request_for(name), platform, requested=layout,
                                      **DEPLOYMENTS[name][2])
    except UnsupportedRequestError as error:
        return {"resolved": None, "error": str(error)}
    return {"resolved": resolution.layout.layout.value, "backends": resolution.backends}


def theirs(case: dict[str, Any]) -> dict[str, Any]:
    if case["resolved"] is None:
        return {"resolved": None}
    return {"resolved": case["resolved"], "backends": case["backends"]}


def test_the_harness_covers_every_capability_kind_and_layout() -> None:
    assert {case["capability"] for case in CASES} == {"8.0", "8.9", "9.0", "10.0", "12.0"}
    assert {case["layout"] for case in CASES} == {None, *(lay.value for lay in KVCacheLayout)}
    assert set(DEPLOYMENTS) == {case["deployment"] for case in CASES}
    assert len(CASES) == 2 * (11 * 5 * 7 + 8)


@pytest.mark.parametrize("case", CASES, ids=lambda c: (
    f"{c['deployment']}@{c['capability']}:{c['layout']}:{c['attention_backend']}"
    f"{'' if c['flashinfer'] else ':no-flashinfer'}"))
def test_backends_and_layout_are_vllms(case: dict[str, Any]) -> None:
    got, want = ours(case), theirs(case)
    got.pop("error", None)
    assert got == want


def test_an_explicit_layout_vllm_refuses_is_refused_with_its_reason() -> None:
    with pytest.raises(UnsupportedRequestError, match=r"LBNHC.*valid layouts: \['LBHNC', "
                                                      r"'BLHNC'\]"):
        resolve_platform(request_for("llama-3.1-8b"), Platform((10, 0)),
                         requested=KVCacheLayout.LBNHC)
    with pytest.raises(UnsupportedRequestError, match="LHBNC"):
        resolve_platform(request_for("deepseek-v4-flash"), Platform((9, 0)),
                         requested=KVCacheLayout.LHBNC)
