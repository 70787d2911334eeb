"""The kernels' stride rules (targets/vllm/platform/contracts.py) against plans, with the
expected verdicts worked out here by hand: a latent block stride must be a whole number of
rows for a kernel that reads flat rows; an indexer block stride a multiple of 256 bytes."""

from __future__ import annotations

import pytest

import hisparse_plan as hp
from hisparse_plan.errors import PlanError, UnsupportedRequestError
from hisparse_plan.models import KVCacheLayout
from hisparse_plan.presets import Settings, build_request, load_preset
from hisparse_plan.targets.vllm.platform import (
    Platform,
    check_stride_contracts,
    resolve_platform,
    stride_contracts,
)
from hisparse_plan.targets.vllm.platform.contracts import INDEXER_PAGES

V32 = load_preset("deepseek-v3.2").architecture
# One block of DeepSeek-V3.2 without HiSparse, every layer's page back to back (a
# block-outermost layout): 61 layers x (64 x 656 latent + 64 x 132 indexer) bytes.
BLOCK_OUTERMOST_STRIDE = 61 * (64 * 656 + 64 * 132)


def test_an_indexer_block_stride_off_256_bytes_is_refused_on_deep_gemm_gpus() -> None:
    # The golden HiSparse plan's indexer block is 545,792 bytes (2132 x 256); one indexer
    # page alone, 64 x 132 = 8,448 bytes, is 33 x 256: a layer-outermost indexer is fine too.
    assert 64 * 132 % 256 == 0
    request = build_request(V32, Settings(hisparse=False, block_size=16,
                                          layout=KVCacheLayout.LBNHC))
    plan = hp.plan(request)
    indexer = next(t for t in plan.tensors if "model.layers.0.self_attn.indexer.k_cache"
                   in t.layers)
    assert indexer.block_stride == 16 * 132 == 2112  # 8 x 256 + 64
    backends = resolve_platform(request, Platform((9, 0))).backends
    with pytest.raises(UnsupportedRequestError, match=r"2112 bytes is not a multiple of 256 "
                                                      r"bytes.*sparse_mqa_logits"):
        check_stride_contracts(plan, request, stride_contracts(request, backends, (9, 0)))


def test_the_worked_block_stride_is_no_whole_number_of_rows() -> None:
    assert BLOCK_OUTERMOST_STRIDE == 3_076_352
    assert BLOCK_OUTERMOST_STRIDE % 656 == 368
    assert BLOCK_OUTERMOST_STRIDE % 256 == 0


def test_a_flat_row_backend_refuses_a_block_outermost_latent_cache() -> None:
    request = build_request(V32, Settings(hisparse=False, layout=KVCacheLayout.BLNHC))
    plan = hp.plan(request)  # FlashMLA's 64-token fp8 pages: every GPU but 12.x reads it
    resolution = resolve_platform(request, Platform((12, 0)), requested=KVCacheLayout.BLNHC)
    assert resolution.backends["sparse_mla"] == "FLASHINFER_MLA_SPARSE_SM120"
    with pytest.raises(UnsupportedRequestError, match=r"block stride 3076352 bytes is not a "
                                                      r"multiple of 656 bytes.*flat_kv_row_view"):
        check_stride_contracts(plan, request, stride_contracts(
            request, resolution.backends, (12, 0)))
    for capability in ((9, 0), (10, 0)):
        backends = resolve_platform(request, Platform(capability),
                                    requested=KVCacheLayout.BLNHC).backends
        assert stride_contracts(request, backends, capability) == (INDEXER_PAGES,)
        check_stride_contracts(plan, request, stride_contracts(request, backends, capability))


def test_a_layer_outermost_latent_cache_holds_every_contract() -> None:
    request = build_request(V32, Settings(hisparse=False, layout=KVCacheLayout.LBNHC))
    plan = hp.plan(request)
    backends = resolve_platform(request, Platform((12, 0))).backends
    check_stride_contracts(plan, request, stride_contracts(request, backends, (12, 0)))
    latent = next(t for t in plan.tensors if "model.layers.0.self_attn.attn" in t.layers)
    assert latent.block_stride == 64 * 656


def test_bf16_rows_are_read_flat_on_every_gpu_so_plan_refuses_them_block_outermost() -> None:
    # 576 bf16 elements: 1152-byte rows; 61 x 64 x (1152 + 132) = 5,012,736 = 4351 x 1152 + 384.
    assert 61 * 64 * (1152 + 132) % 1152 == 384
    request = build_request(V32, Settings(hisparse=False, kv_dtype="bfloat16",
                                          layout=KVCacheLayout.BLNHC))
    with pytest.raises(PlanError, match="5012736 bytes is not a multiple of 1152"):
        hp.plan(request)



def test_check_plan_refuses_a_plan_the_kernels_would_misread(
        monkeypatch: pytest.MonkeyPatch) -> None:
    request = build_request(V32, Settings(hisparse=False, kv_dtype="bfloat16",
                                          layout=KVCacheLayout.BLNHC))
    pipeline = "hisparse_plan.targets.vllm.pipeline"
    with monkeypatch.context() as patched:  # the plan as a planner without the rules writes it
        patched.setattr(f"{pipeline}.stride_contracts", lambda request, backends: ())
        plan = hp.plan(request)
    with pytest.raises(hp.PlanInvariantError, match="5012736 bytes is not a multiple of 1152"):
        hp.check_plan(plan, request=request)


def test_hisparse_device_blocks_hold_both_contracts() -> None:
    # HiSparse's device block (the golden deepseek_v32_fp8 plan's) is 545,792 bytes.
    assert 545_792 % 656 == 0
    assert 545_792 % 256 == 0
    request = build_request(V32, Settings())
    plan = hp.plan(request)
    for capability in ((9, 0), (10, 0), (12, 0)):
        backends = resolve_platform(request, Platform(capability)).backends
        check_stride_contracts(plan, request, stride_contracts(request, backends, capability))
