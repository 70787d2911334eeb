"""`verify` on real CPU buffers: sound plans pass, tampered ones are caught without the
static checker, and failures name the tensor, layer, block and byte."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

pytest.importorskip("torch")  # the backend is an extra: skip without it

from hypothesis import given, settings
from hypothesis import strategies as st

import hisparse_plan as hp
from hisparse_plan.torch import BackendError, VerifyError, VerifyReport, allocate, verify
from hisparse_plan.torch.verify_layers import read_raw, select_blocks
from hisparse_plan.torch.vllm import verification as verify_module
from hisparse_plan.torch.vllm.binding import bind_views
from hisparse_plan.torch.vllm.host import host_pool_bytes
from hisparse_plan.views import plan_views
from support.planning_support import plan_or_none
from support.strategies import hisparse_requests
from support.torch_support import (
    SMALL_GOLDEN,
    exact_fit_plan,
    golden_plan,
    small_plan,
    tampered,
    tensor_index,
    torch,
    two_tensor_source_plan,
)


def run(plan: hp.KVCachePlan, *, on: hp.KVCachePlan | None = None,
        blocks: int | None = None) -> VerifyReport:
    """Verify `plan` on pools allocated for `on` (the plan itself by default)."""
    with allocate(on or plan, device="cpu", pin=False, prefault_threads=0) as pools:
        return verify(plan, pools, blocks=blocks)


def test_small_golden_plan_as_is_on_a_block_sample() -> None:
    plan = golden_plan(SMALL_GOLDEN)
    assert plan.host_pool is not None
    report = run(plan, blocks=8)
    assert report.sampled
    views = plan_views(plan)
    # Each pool is sampled: 8 blocks spread out from the first to the last, plus blocks 1
    # and n-2.
    sample = 10
    expected_pages = sum(min(sample, v.num_blocks) for v in views.values())
    assert report.pages == expected_pages
    assert report.layers == len(views) == 19
    assert report.groups == len(plan.groups)


def test_small_plan_every_block() -> None:
    plan = small_plan()
    assert plan.host_pool is not None
    report = run(plan)
    views = plan_views(plan)
    assert not report.sampled
    assert report.pages == sum(v.num_blocks for v in views.values())
    assert report.bytes == sum(v.num_blocks * v.page_size_bytes for v in views.values())
    assert report.seconds > 0
    assert report.gb_per_s == report.bytes / report.seconds / 1e9


def test_progress_counts_up_to_the_total() -> None:
    plan = small_plan()
    seen: list[tuple[str, int, int]] = []
    with allocate(plan, device="cpu", pin=False, prefault_threads=0) as pools:
        verify(plan, pools, progress=lambda *step: seen.append(step))
    total = len(plan.groups) + 2  # every group, and a block-id pass per pool
    assert seen == [("verify", done, total) for done in range(total + 1)]


def test_sample_always_has_both_ends() -> None:
    blocks, everything = select_blocks(1000, 5, torch.device("cpu"))
    assert not everything
    assert blocks.tolist() == [0, 1, 250, 500, 749, 998, 999]
    blocks, everything = select_blocks(3, 5, torch.device("cpu"))
    assert everything
    assert blocks.tolist() == [0, 1, 2]


def test_bad_arguments() -> None:
    plan = small_plan()
    with allocate(plan, device="cpu", pin=False, prefault_threads=0) as pools:
        with pytest.raises(BackendError, match="blocks is 0"):
            verify(plan, pools, blocks=0)
        with pytest.raises(BackendError, match="chunk_bytes is 0"):
            verify(plan, pools, chunk_bytes=0)
    with pytest.raises(BackendError, match="released"):
        verify(plan, pools)
    with allocate(plan, device="meta", pin=False) as meta, \
            pytest.raises(BackendError, match="use meta_check"):
        verify(plan, meta)


@settings(max_examples=40)
@given(hisparse_requests(max_layers=4, small=True), st.sampled_from([None, 2, 5]),
       st.sampled_from([None, 1, 5000]))
def test_generated_plans_verify(
    request: dict[str, Any], blocks: int | None, chunk_bytes: int | None
) -> None:
    plan = plan_or_none(request)
    if plan is None:
        return
    with allocate(plan, device="cpu", pin=False, prefault_threads=1) as pools:
        host_bytes = host_pool_bytes(plan) if plan.host_pool else -1
        for view in pools.views().values():
            assert view.untyped_storage().nbytes() in (plan.device_pool.size, host_bytes)
        report = verify(plan, pools, blocks=blocks, chunk_bytes=chunk_bytes)
    assert report.layers == len(plan_views(plan))


@st.composite
def tamperings(draw: st.DrawFn) -> tuple[hp.KVCachePlan, hp.KVCachePlan] | None:
    """A generated plan and a copy with one tensor's offset or stride nudged (None when the
    request is refused)."""
    plan = plan_or_none(draw(hisparse_requests(max_layers=4, small=True)))
    if plan is None:
        return None
    index = draw(st.integers(0, len(plan.tensors) - 1))
    field = draw(st.sampled_from(["offset", "block_stride", "layer_stride"]))
    delta = draw(st.sampled_from([-4096, -64, -8, -2, -1, 1, 2, 8, 64, 4096]))

    def edit(dumped: dict[str, Any]) -> None:
        tensor = dumped["tensors"][index]
        tensor[field] = max(0, tensor[field] + delta)

    return plan, tampered(plan, edit)


@settings(max_examples=100)
@given(tamperings())
def test_verify_never_refuses_what_check_plan_proves(
    pair: tuple[hp.KVCachePlan, hp.KVCachePlan] | None,
) -> None:
    if pair is None:
        return
    plan, bad = pair
    try:
        hp.check_plan(bad)
    except hp.PlanError:
        sound = False
    else:
        sound = True
    if sound:
        run(bad, on=plan)  # a VerifyError here would be a false alarm
    else:
        # Caught or not (check_plan is stricter), only a BackendError may come out.
        with contextlib.suppress(BackendError):
            run(bad, on=plan)


# Tampered plans, caught on real buffers with the static checker never asked.

def test_shifted_offset_into_another_tensor_of_the_group() -> None:
    plan = two_tensor_source_plan()
    second = tensor_index(plan, "model.layers.2.self_attn.attn")
    page = 73728

    def shift(dumped: dict[str, Any]) -> None:
        dumped["tensors"][second]["offset"] -= page

    bad = tampered(plan, shift)
    with pytest.raises(VerifyError) as caught:
        run(bad, on=plan)
    error = caught.value
    # The second tensor's block 0 now covers the first tensor's last page: layer 1, block 129.
    assert (error.tensor, error.layer, error.block) == (
        second - 1, "model.layers.1.self_attn.attn", 129)
    assert error.byte_offset == plan.tensors[second].offset - page
    assert "verify failed (block ids)" in str(error)
    assert "expected" in str(error)


def test_shifted_offset_past_the_pool() -> None:
    plan = small_plan()

    def shift(dumped: dict[str, Any]) -> None:
        dumped["tensors"][0]["offset"] += 73728

    with pytest.raises(BackendError, match=r"tensors\[0\] layer 'model.layers.3.self_attn.attn'"
                                           r": block 129's page ends at byte"):
        run(tampered(plan, shift), on=plan)


def test_block_stride_one_page_short_in_an_exactly_filled_group() -> None:
    plan = exact_fit_plan()
    index = tensor_index(plan, "model.layers.0.self_attn.indexer.k_cache")

    def shorten(dumped: dict[str, Any]) -> None:
        dumped["tensors"][index]["block_stride"] -= 1024

    with pytest.raises(VerifyError) as caught:
        run(tampered(plan, shorten), on=plan)
    error = caught.value
    # Block 1 now starts where layer 3 of block 0 is, and layer 3 is written after layer 0.
    assert (error.tensor, error.layer, error.block, error.byte_offset) == (
        index, "model.layers.0.self_attn.indexer.k_cache", 1, 3 * 1024)
    assert "verify failed (block ids)" in str(error)


def test_block_stride_one_page_short_across_groups() -> None:
    # The indexer's block stride 147456 less one 16 KiB page still fits its 64 KiB of pages, but
    # block b of the indexer now runs into block b-1 of the resident and hot groups' space.
    plan = small_plan()
    index = tensor_index(plan, "model.layers.0.self_attn.indexer.k_cache")

    def shorten(dumped: dict[str, Any]) -> None:
        dumped["tensors"][index]["block_stride"] -= 16384

    with pytest.raises(VerifyError, match=r"verify failed \(block ids\).*a page of another "
                                          r"block id") as caught:
        run(tampered(plan, shorten), on=plan)
    assert caught.value.layer.startswith("model.layers.")


def test_overlapping_layers() -> None:
    plan = small_plan()
    index = tensor_index(plan, "model.layers.0.self_attn.indexer.k_cache")

    def overlap(dumped: dict[str, Any]) -> None:
        dumped["tensors"][index]["layer_stride"] //= 2

    with pytest.raises(VerifyError) as caught:
        run(tampered(plan, overlap), on=plan)
    error = caught.value
    # Layer 1 now starts half way into layer 0's page: layer 0 reads layer 1's bytes.
    assert (error.tensor, error.layer, error.block, error.byte_offset) == (
        index, "model.layers.0.self_attn.indexer.k_cache", 0, 8192)
    assert "verify failed (view -> pool)" in str(error)
    assert "head 0, token 32, byte 0" in str(error)


def test_one_block_stride_of_zero() -> None:
    plan = small_plan()

    def collapse(dumped: dict[str, Any]) -> None:
        dumped["tensors"][0]["block_stride"] = 0

    with pytest.raises(VerifyError, match="blocks 0 and 1 share every byte") as caught:
        run(tampered(plan, collapse), on=plan)
    assert (caught.value.tensor, caught.value.block) == (0, 1)


def test_a_view_that_reads_elsewhere_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    # The raw side never uses the views: a view with its heads and tokens swapped is caught.
    plan = small_plan()
    bind = bind_views

    def swapped(*args: Any) -> dict[str, Any]:
        views = bind(*args)
        full = views["model.extra.1.attn"]
        heads, tokens = full.stride(1), full.stride(2)
        views["model.extra.1.attn"] = full.as_strided(
            full.shape, (full.stride(0), tokens, heads, 1), full.storage_offset())
        return views

    monkeypatch.setattr(verify_module, "bind_views", swapped)
    with pytest.raises(VerifyError) as caught:
        run(plan)
    assert caught.value.layer == "model.extra.1.attn"


def test_a_corrupted_pool_byte_is_reported_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    # A pool that does not keep what is written: one byte of block 5 of a hot layer flips.
    plan = small_plan()
    hot = "model.layers.2.self_attn.attn.hisparse_hot"
    view = plan_views(plan)[hot]
    address = view.offset + 5 * view.block_stride + 1000
    read = read_raw

    def flaky(layer: Any, ids: torch.Tensor) -> torch.Tensor:
        got = read(layer, ids).clone()
        if layer.view.name == hot:
            row = (ids == 5).nonzero().flatten()
            got[row, 1000] ^= 0x10
        return got

    monkeypatch.setattr(verify_module, "read_raw", flaky)
    with pytest.raises(VerifyError) as caught:
        run(plan)
    error = caught.value
    assert (error.layer, error.block, error.byte_offset) == (hot, 5, address)
    assert "holds 0x" in str(error)
    assert "expected 0x" in str(error)
