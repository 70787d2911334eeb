"""Regular plans (no HiSparse, no host pool) on real buffers: every regular golden shape, cut to
a few layers and MiB, allocated, bound and verified block by block on the CPU."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")  # the backend is an extra: skip without it

import hisparse_plan as hp
from hisparse_plan.presets import Settings, build_request, load_preset
from hisparse_plan.torch import (
    HostMemory,
    HostMemoryError,
    allocate,
    check_bound,
    meta_check,
    verify,
)
from hisparse_plan.torch.vllm import pools as pools_module
from hisparse_plan.views import plan_views
from support.torch_support import (
    MIB,
    pipeline_small_request,
    plan_of,
    qwen3_next_small_request,
    shrunk_plan,
)
from support.whisper import whisper_request

SHRUNK = {
    "regular_deepseek_v32_no_hisparse_lbnhc": {"uniform_type"},
    "regular_gemma3_27b_swa": {"sliding_window", "full_attention"},
    "regular_gpt_oss_120b": {"sliding_window", "full_attention"},
    "regular_llama3_8b_bf16": {"full_attention"},
    "regular_llama4_scout_chunked_local": {"chunked_local_attention", "full_attention"},
}
"""Each one-stage regular golden case (Qwen3-Next has its own cut) and its group kinds."""


def _check(plan: hp.KVCachePlan, stage: int | None = None) -> None:
    index = 0 if stage is None else stage
    views = {name: view for name, view in plan_views(plan).items() if view.stage == index}
    with allocate(plan, device="cpu", pin=False, prefault_threads=0, stage=stage) as pools:
        assert pools.host is None
        assert pools.device.numel() == plan.device_pools[index].size <= 64 * MIB
        bound = pools.views()
        assert list(bound) == list(views)
        for name, view in views.items():
            check_bound(view, bound[name], pools.device)
        report = verify(plan, pools)
    assert (report.layers, report.sampled) == (len(views), False)
    assert report.pages == len(views) * plan.num_blocks
    assert report.groups == len({view.group for view in views.values()})


@pytest.mark.parametrize("case", sorted(SHRUNK))
def test_a_regular_golden_shape_verifies(case: str) -> None:
    plan = shrunk_plan(case)
    assert plan.host_pool is None
    assert {group.spec.kind for group in plan.groups} == SHRUNK[case]
    _check(plan)


def test_the_deepseek_v4_flash_preset_verifies() -> None:
    """Compressed MLA, sliding-window MLA and float32 compressor states, each padded to 576
    bytes, in packed groups of four block sizes: every page written and read back in place."""
    preset = load_preset("deepseek-v4-flash")
    small = Settings(gpu_mem_bytes=64 * MIB, max_model_len=1024, max_num_batched_tokens=64)
    plan = plan_of(build_request(preset.architecture, small).model_dump(mode="json"))
    assert {group.spec.block_size for group in plan.groups} == {4, 8, 64, 256}
    _check(plan)


def test_the_deepseek_v4_flash_plan_binds_at_full_size_on_meta() -> None:
    preset = load_preset("deepseek-v4-flash")
    full = Settings(gpu_mem_bytes=60 * 2**30, max_model_len=65536)
    plan = plan_of(build_request(preset.architecture, full).model_dump(mode="json"))
    report = meta_check(plan)
    assert report.device_bytes == plan.device_pool.size == 64280 * 1002240
    assert len(report.views) == 167


def test_the_qwen3_next_shape_verifies() -> None:
    plan = plan_of(qwen3_next_small_request())
    assert {group.spec.kind for group in plan.groups} == {"mamba", "full_attention"}
    _check(plan)


@pytest.mark.parametrize("stage", range(4))
def test_each_pipeline_stage_verifies(stage: int) -> None:
    _check(plan_of(pipeline_small_request()), stage)


def test_a_stage_pool_that_does_not_fit_is_named_by_its_stage(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plan = plan_of(pipeline_small_request())
    size = plan.device_pools[2].size
    monkeypatch.setattr(pools_module, "available_host_memory",
                        lambda: HostMemory(size, "MemAvailable (test)"))
    with pytest.raises(HostMemoryError, match=r"^the CPU stage 2 device pool: ") as caught:
        allocate(plan, device="cpu", pin=False, stage=2)
    assert caught.value.requested == size


def test_whispers_cross_attention_views_bind_and_verify() -> None:
    """An encoder-decoder plan (Whisper): the cross-attention layers' K and V views are bound
    like any attention layer's, in the block table of their own group."""
    plan = hp.plan(whisper_request(memory=64 * MIB))
    assert [group.spec.kind for group in plan.groups] == ["full_attention", "cross_attention"]
    _check(plan)
