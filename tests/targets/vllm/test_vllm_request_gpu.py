"""A request may name the GPU vLLM runs on (`device.compute_capability`): `plan()` then holds
the plan to the stride rules of the kernels of the backends vLLM 0.34 selects there; without
it, to the rule every GPU's backends share, as before. Verdicts worked out here by hand:
DeepSeek-V3.2 without HiSparse in BLNHC has a block of 61 x (64 x 656 + 64 x 132) = 3,076,352
bytes, 368 bytes over a whole number of 656-byte latent rows and a multiple of 256."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

import hisparse_plan as hp
from hisparse_plan.errors import UnsupportedRequestError
from hisparse_plan.models import KVCacheLayout, PlanRequest
from hisparse_plan.presets import Settings, build_request, load_preset
from support.golden import GOLDEN
from support.gpu_requests import on_gpu, v32

LLAMA = load_preset("llama-3-8b").architecture


def test_a_request_names_no_gpu_unless_asked_and_reads_one_as_a_pair() -> None:
    text = (GOLDEN / "deepseek_v32_fp8.request.json").read_text()
    assert "compute_capability" not in text
    assert PlanRequest.model_validate_json(text).device.compute_capability is None
    data = json.loads(text)
    data["device"]["compute_capability"] = [12, 0]
    assert PlanRequest.model_validate(data).device.compute_capability == (12, 0)
    data["device"]["compute_capability"] = [12, 10]
    with pytest.raises(ValidationError, match=r"device\.compute_capability"):
        PlanRequest.model_validate(data)


def test_the_gpus_flat_row_kernel_refuses_what_every_gpu_would_not() -> None:
    request = v32(KVCacheLayout.BLNHC)
    plain = hp.plan(request)  # FlashMLA's 64-token pages: no GPU-independent rule applies
    for capability in ([9, 0], [10, 0]):
        assert hp.plan(on_gpu(request, capability)) == plain
    with pytest.raises(UnsupportedRequestError, match=(
            r"model\.layers\.0\.self_attn\.attn: block stride 3076352 bytes is not a multiple "
            r"of 656 bytes, which flat_kv_row_view")):
        hp.plan(on_gpu(request, [12, 0]))


def test_the_indexer_rule_holds_on_deep_gemm_gpus_only() -> None:
    request = v32(KVCacheLayout.LBNHC, block_size=16)  # indexer block 16 x 132 = 8 x 256 + 64
    hp.plan(request)
    hp.plan(on_gpu(request, [12, 0]))
    with pytest.raises(UnsupportedRequestError, match=(
            r"indexer\.k_cache: block stride 2112 bytes is not a multiple of 256 bytes")):
        hp.plan(on_gpu(request, [9, 0]))


def test_a_gpu_no_sparse_backend_runs_on_is_refused_as_vllm_refuses_it() -> None:
    with pytest.raises(UnsupportedRequestError, match=(
            r"no valid attention backend for the sparse_mla layers on compute capability 8\.0")):
        hp.plan(on_gpu(v32(KVCacheLayout.LBNHC), [8, 0]))


def test_a_model_without_sparse_mla_plans_the_same_on_any_gpu() -> None:
    request = build_request(LLAMA, Settings(layout=KVCacheLayout.BLNHC))
    plain = hp.plan(request)
    for capability in ([8, 0], [9, 0], [12, 0]):
        assert hp.plan(on_gpu(request, capability)) == plain
