"""`check_plan` holds a plan to the kernels' stride rules of the GPU its request names
(`device.compute_capability`): it plans the request again, and the GPU's rules refuse what a
request without a GPU accepts. Worked by hand: DeepSeek-V3.2 without HiSparse in BLNHC has a
block of 61 x (64 x 656 + 64 x 132) = 3,076,352 bytes, 4,689 latent rows of 656 and 368 over;
in 16-token LBNHC blocks an indexer block is 16 x 132 = 2,112 bytes, 8 x 256 and 64 over."""

from __future__ import annotations

import pytest

import hisparse_plan as hp
from hisparse_plan.models import KVCacheLayout
from support.gpu_requests import on_gpu, v32


def test_the_worked_numbers() -> None:
    assert 61 * (64 * 656 + 64 * 132) == 3_076_352 == 4689 * 656 + 368
    assert 16 * 132 == 2112 == 8 * 256 + 64


def test_a_plan_the_gpus_latent_kernel_misreads_is_refused() -> None:
    request = v32(KVCacheLayout.BLNHC)
    plan = hp.plan(request)
    hp.check_plan(plan, request=request)
    for capability in ([9, 0], [10, 0]):
        hp.check_plan(plan, request=on_gpu(request, capability))
    with pytest.raises(hp.PlanInvariantError, match=(
            r"block stride 3076352 bytes is not a multiple of 656 bytes, which "
            r"flat_kv_row_view")):
        hp.check_plan(plan, request=on_gpu(request, [12, 0]))


def test_a_plan_the_gpus_indexer_kernel_misreads_is_refused() -> None:
    request = v32(KVCacheLayout.LBNHC, block_size=16)
    plan = hp.plan(request)
    hp.check_plan(plan, request=request)
    hp.check_plan(plan, request=on_gpu(request, [12, 0]))
    with pytest.raises(hp.PlanInvariantError, match=(
            r"indexer\.k_cache: block stride 2112 bytes is not a multiple of 256 bytes, which "
            r"sparse_mqa_logits_paged_decode")):
        hp.check_plan(plan, request=on_gpu(request, [10, 0]))
