"""The planner's own plans of every preset, for both engines, at small sizes: each allocates on
CPU and verifies (a sample of blocks), or, where SGLang's pools cannot hold the model, is
refused naming why."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")  # the backend is an extra: skip without it

import hisparse_plan as hp
from hisparse_plan.adapters.sglang import sglang_request
from hisparse_plan.models.request import PlanRequest
from hisparse_plan.models.sglang_settings import SGLangSettings
from hisparse_plan.presets import (
    ModelArchitecture,
    Settings,
    build_request,
    load_preset,
    preset_names,
)
from hisparse_plan.targets import plan_for_engine
from hisparse_plan.torch import allocate, verify

MIB = 2**20
PRESETS = preset_names()
VLLM_GPU_MIB = (64, 128, 256)
"""GPU memory tried in turn for a vLLM plan: the first that holds one 128-token request."""
SGLANG_REFUSES: dict[str, str] = {}
"""Presets SGLang's pools cannot hold, and what the refusal names (none: llama-4-scout's
chunked layers take SGLang's window pool, tests/targets/sglang/test_sglang_llama4.py)."""


def _sparse(name: str) -> bool:
    return isinstance(load_preset(name).architecture, ModelArchitecture)


def vllm_request(name: str) -> PlanRequest:
    """The preset with 128-token requests on the smallest GPU of VLLM_GPU_MIB that holds one
    (sparse-MLA presets with HiSparse: a 64 MiB host pool and a 2048-row hot buffer)."""
    arch = load_preset(name).architecture
    sparse = _sparse(name)
    refusal: hp.PlanError | None = None
    for gpu in VLLM_GPU_MIB:
        request = build_request(arch, Settings(
            gpu_mem_bytes=gpu * MIB, max_model_len=128,
            host_pool_bytes=64 * MIB if sparse else None,
            device_buffer_size=2048 if sparse else None,
        ))
        try:
            hp.plan(request)
        except hp.CapacityError as error:
            refusal = error
            continue
        return request
    raise AssertionError(f"{name}: no GPU of {VLLM_GPU_MIB} MiB holds a request: {refusal}")


def sglang_request_of(name: str) -> PlanRequest:
    """The preset on one of eight ranks with 256 MiB of pools: 1024-token requests, four at
    once, at most 2048 tokens (512 with HiSparse, whose host pool keeps twice as many; 8256 for
    Llama-4, whose window pool must hold its 8192-token chunk and a page), the window pool as
    large as the full one, ten Mamba slots. DeepSeek-V4 (fp8 rows only): one request, 1024
    tokens, half of them in its window pool."""
    engine: dict[str, Any] = {
        "name": "sglang", "context_length": 1024, "max_running_requests": 4,
        "max_total_tokens": 2048, "swa_full_tokens_ratio": 1.0, "max_mamba_cache_size": 10,
    }
    if _sparse(name):
        engine.update(enable_hisparse=True, max_total_tokens=512)
    if name == "llama-4-scout":  # SGLang admits a request only with window + a page free
        engine.update(max_total_tokens=8256)
    if name == "deepseek-v4-flash":
        engine = {"name": "sglang", "context_length": 1024, "kv_cache_dtype": "fp8_e4m3",
                  "max_running_requests": 1, "max_total_tokens": 1024,
                  "swa_full_tokens_ratio": 0.5}
    arch = load_preset(name).architecture
    return sglang_request(arch, SGLangSettings.model_validate(engine), tp=8,
                          available_bytes=256 * MIB)


def _allocates_and_verifies(plan: hp.KVCachePlan | Any) -> None:
    with allocate(plan, device="cpu", pin=False, prefault_threads=0) as pools:
        report = verify(plan, pools, blocks=2)
    assert report.layers > 0
    assert report.bytes > 0


@pytest.mark.parametrize("name", PRESETS)
def test_every_presets_vllm_plan_verifies(name: str) -> None:
    request = vllm_request(name)
    plan = hp.plan(request)
    hp.check_plan(plan, request=request)
    _allocates_and_verifies(plan)


@pytest.mark.parametrize("name", PRESETS)
def test_every_presets_sglang_plan_verifies_or_is_refused(name: str) -> None:
    request = sglang_request_of(name)
    if name in SGLANG_REFUSES:
        with pytest.raises(hp.UnsupportedRequestError, match=SGLANG_REFUSES[name]):
            plan_for_engine(request)
        return
    plan = plan_for_engine(request)
    hp.check_plan(plan, request=request)
    _allocates_and_verifies(plan)
