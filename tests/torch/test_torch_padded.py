"""Padded pages on real buffers: Qwen3-Next's Mamba states padded to the attention page, and
attention pages padded by SPEC 7.3.2, allocated, bound and verified on the CPU."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")  # the backend is an extra: skip without it

from hisparse_plan.models import AttentionLayerSpec, MambaSpec
from hisparse_plan.torch import VerifyError, allocate, check_bound, meta_check, verify
from hisparse_plan.views import plan_views, spec_of
from support.torch_support import (
    MIB,
    padded_attention_request,
    plan_of,
    qwen3_next_small_request,
    tampered,
    torch,
)

ATTENTION_PAGE = 544 * 2 * 256 * 2 * 2
"""Qwen3-Next's attention page: 544 tokens x 2 KV heads x 256 x bfloat16, K and V."""
MAMBA_STATE = 3 * 8192 * 2 + 32 * 128 * 128 * 2
"""Its Mamba layer's natural state bytes: the conv and SSM states, bfloat16."""


def test_the_small_qwen3_next_plan_keeps_the_padding() -> None:
    plan = plan_of(qwen3_next_small_request())
    kinds = [group.spec.kind for group in plan.groups]
    assert kinds == ["mamba", "mamba", "mamba", "full_attention"]
    assert {group.spec.page_size_bytes for group in plan.groups} == {ATTENTION_PAGE}
    mamba = plan.groups[0].spec
    assert isinstance(mamba, MambaSpec)
    assert (mamba.content_bytes, mamba.page_size_padded, mamba.block_size) == (
        MAMBA_STATE, ATTENTION_PAGE, 1088)
    assert MAMBA_STATE < ATTENTION_PAGE
    assert plan.device_pool.size <= 16 * MIB
    assert plan.num_blocks >= 4


def test_mamba_views_are_the_natural_state_bytes_of_padded_pages() -> None:
    plan = plan_of(qwen3_next_small_request())
    views = plan_views(plan)
    with allocate(plan, device="cpu", pin=False, prefault_threads=0) as pools:
        bound = pools.views()
        assert list(bound) == list(views)
        for name, view in views.items():
            check_bound(view, bound[name], pools.device)
        state = bound["model.layers.4.linear_attn"]
        assert (tuple(state.shape), state.dtype) == ((plan.num_blocks, MAMBA_STATE),
                                                     torch.uint8)
        # Layer 4 is the second layer of its tensor: one padded page in, two per block.
        assert (state.stride(), state.storage_offset()) == ((2 * ATTENTION_PAGE, 1),
                                                            ATTENTION_PAGE)
        attention = bound["model.layers.7.self_attn.attn"]
        # K and V side by side: 2 x 256 elements per head and token.
        assert (tuple(attention.shape), attention.dtype) == (
            (plan.num_blocks, 2, 544, 512), torch.bfloat16)
        pools.device.zero_()
        state[3, MAMBA_STATE - 1] = 7
        address = ATTENTION_PAGE + 3 * 2 * ATTENTION_PAGE + MAMBA_STATE - 1
        assert torch.nonzero(pools.device).flatten().tolist() == [address]
        assert torch.equal(pools.view("model.layers.4.linear_attn"), state)


def test_a_padded_qwen3_next_plan_verifies_every_page() -> None:
    plan = plan_of(qwen3_next_small_request())
    with allocate(plan, device="cpu", pin=False, prefault_threads=0) as pools:
        report = verify(plan, pools)
    blocks = plan.num_blocks
    assert (report.groups, report.layers, report.pages, report.sampled) == (
        4, 8, 8 * blocks, False)
    assert report.bytes == blocks * (6 * MAMBA_STATE + 2 * ATTENTION_PAGE)


def test_a_block_stride_without_the_padding_fails_verify() -> None:
    # Mamba pages packed at their natural size: block 1's state starts inside block 0 of the
    # attention group that overlays the same bytes.
    plan = plan_of(qwen3_next_small_request())

    def unpad(dumped: dict[str, Any]) -> None:
        dumped["tensors"][0]["block_stride"] = 2 * MAMBA_STATE

    bad = tampered(plan, unpad)
    with allocate(plan, device="cpu", pin=False, prefault_threads=0) as pools, \
            pytest.raises(VerifyError, match=r"verify failed \(block ids\)"):
        verify(bad, pools)


def test_attention_pages_padded_by_unified_pages() -> None:
    plan = plan_of(padded_attention_request())
    full = plan.groups[-1].spec
    assert isinstance(full, AttentionLayerSpec)
    assert (full.kind, full.page_size_padded, full.page_size_bytes) == (
        "full_attention", 24576, 24576)
    view = plan_views(plan)["model.layers.5.self_attn.attn"]
    assert spec_of(plan)[view.name][1] is full
    # 16 tokens x 2 heads x 128 x bfloat16 x (K, V) = 16384 natural bytes per 24576-byte page.
    assert (view.shape, view.block_stride) == ((plan.num_blocks, 2, 16, 256), 24576)
    assert meta_check(plan).layers == 6
    with allocate(plan, device="cpu", pin=False, prefault_threads=0) as pools:
        report = verify(plan, pools)
    assert (report.layers, report.pages) == (6, 6 * plan.num_blocks)
    assert report.bytes == plan.num_blocks * (4 * 24576 + 2 * 16384)
