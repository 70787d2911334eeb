"""SGLang plans on the torch backend (CPU): pools allocated as planned, SGLang's own tensors bound
exactly as its pool objects hold them, every page and tensor verified on real bytes, tampered
plans refused before allocation or caught by verify."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("torch")  # the backend is an extra: skip without it

import hisparse_plan as hp
from hisparse_plan.models.sglang_plan import SGLangPlan
from hisparse_plan.targets.sglang import plan_sglang
from hisparse_plan.torch import (
    BackendError,
    HostMemory,
    HostMemoryError,
    SGLangMetaReport,
    SGLangPools,
    UnsoundPlanError,
    VerifyError,
    VerifyReport,
    allocate,
    meta_check,
    verify,
)
from hisparse_plan.torch.sglang import binding as binding_module
from hisparse_plan.torch.sglang import pools as pools_module
from hisparse_plan.torch.sglang import verify as verify_module
from hisparse_plan.torch.sglang.binding import BUFFER_TORCH_DTYPES
from hisparse_plan.torch.verify_layers import read_raw
from support.sglang_hand_plans import HALF, PAGE, ROW_BYTES, ROWS, mha_plan
from support.sglang_requests import dsa_layers, latent, mamba, mha, request, swa
from support.torch_support import FakeRegistrar, torch

Edit = Callable[[dict[str, Any]], None]


def hand_plan(edit: Edit | None = None) -> SGLangPlan:
    dumped = mha_plan()
    if edit is not None:
        edit(dumped)
    return SGLangPlan.model_validate(dumped)


def on_cpu(plan: SGLangPlan, **options: Any) -> SGLangPools:
    return allocate(plan, device="cpu", pin=False, prefault_threads=0, **options)


def run(plan: SGLangPlan, *, on: SGLangPlan | None = None,
        blocks: int | None = None) -> VerifyReport:
    """Verify `plan` on pools allocated for `on` (the plan itself by default)."""
    with on_cpu(on or plan) as pools:
        return verify(plan, pools, blocks=blocks)


REAL = {
    "llama_mha": lambda: request({"a": mha(), "b": mha()}, page_size=64, max_total_tokens=1024),
    "page_size_1": lambda: request({"a": mha(heads=2)}, max_total_tokens=1000),
    "k_and_v_apart": lambda: request({"a": mha(head_size_v=64)}, page_size=64,
                                     max_total_tokens=1024),
    "gpt_oss_swa": lambda: request({"w0": swa(128), "f1": mha(), "w2": swa(128)}, page_size=64,
                                   max_total_tokens=1024, swa_full_tokens_ratio=0.5),
    "mla": lambda: request({"a": latent(), "b": latent()}, page_size=64,
                           max_total_tokens=1024),
    "dsa": lambda: request(dsa_layers(2), max_total_tokens=1024),
    "hisparse": lambda: request(dsa_layers(2), max_total_tokens=1024, enable_hisparse=True,
                                hisparse_host_to_device_ratio=4),
    "mamba": lambda: request({"m0": mamba(), "a1": mha(), "m2": mamba()},
                             max_mamba_cache_size=8, max_total_tokens=1024),
}


def real_plan(case: str) -> SGLangPlan:
    return plan_sglang(REAL[case]())


# --- allocation and binding ------------------------------------------------------------------


@pytest.mark.parametrize("case", ["k_and_v_apart", "mamba"])
def test_tensors_bind_inside_an_allocation_that_starts_inside_a_larger_buffer(case: str) -> None:
    # as_strided counts from the storage's start, so every tensor must be placed from the
    # allocation's own first byte, whatever its offset in the storage.
    plan = real_plan(case)
    lead = 64
    for placed in binding_module.placed_views(plan):
        pool = next(p for p in plan.pools if p.name == placed.allocation[0])
        backing = torch.zeros(lead + pool.size, dtype=torch.uint8)
        allocation = backing[lead:]
        tensor = binding_module.bind_buffer(placed, allocation)
        binding_module.check_buffer(placed, tensor, allocation)
        itemsize = tensor.element_size()
        assert tensor.data_ptr() == (allocation.data_ptr()
                                     + placed.view.storage_offset * itemsize)
        shifted = binding_module.bind_buffer(placed, backing)  # the same view, lead bytes earlier
        with pytest.raises(BackendError, match="start byte"):
            binding_module.check_buffer(placed, shifted, allocation)


def test_a_per_layer_pool_is_one_buffer_per_layer() -> None:
    plan = hand_plan()
    with on_cpu(plan) as pools:
        held = pools.allocations()
        assert list(held) == [("kv", "l0"), ("kv", "l1")]
        for buffer in held.values():
            assert (buffer.dtype, buffer.device.type, buffer.numel()) == (
                torch.uint8, "cpu", 2 * HALF)
            assert buffer.untyped_storage().nbytes() == 2 * HALF
            assert buffer.storage_offset() == 0
        assert held[("kv", "l0")].data_ptr() != held[("kv", "l1")].data_ptr()
        assert "kv pool: 2 buffer(s)" in pools.summary()


def test_buffers_are_what_sglang_holds() -> None:
    plan = hand_plan()
    with on_cpu(plan) as pools:
        buffers = pools.buffers()
        assert list(buffers) == [("kv", layer, name) for layer in ("l0", "l1")
                                 for name in ("k_buffer", "v_buffer")]
        for (_, _, name), tensor in buffers.items():
            assert tensor.dtype == torch.bfloat16
            assert list(tensor.shape) == [ROWS, 8, 128]
            assert list(tensor.stride()) == [1024, 128, 1]
            assert tensor.storage_offset() == (0 if name == "k_buffer" else ROWS * 1024)
        # Fused K/V: both halves of a layer view one storage, each layer its own.
        k, v = buffers[("kv", "l0", "k_buffer")], buffers[("kv", "l0", "v_buffer")]
        assert k.untyped_storage().data_ptr() == v.untyped_storage().data_ptr()
        assert k.untyped_storage().data_ptr() == pools.allocation("kv", "l0").data_ptr()
        other = buffers[("kv", "l1", "k_buffer")]
        assert other.untyped_storage().data_ptr() != k.untyped_storage().data_ptr()


def test_a_k_row_is_its_token_in_the_first_range_of_its_page() -> None:
    plan = hand_plan()
    with on_cpu(plan) as pools:
        buffers, pages = pools.buffers(), pools.pages("l1")
        assert {key: list(value.shape) for key, value in pages.items()} == {
            ("kv", part): [ROWS // PAGE, PAGE * ROW_BYTES] for part in (0, 1)}
        for token in (0, 1, PAGE - 1, PAGE, 700, ROWS - 1):
            block, row = divmod(token, PAGE)
            for name, part in (("k_buffer", 0), ("v_buffer", 1)):
                values = torch.arange(1024, dtype=torch.int16).add(token * 7 + part)
                buffers[("kv", "l1", name)][token] = values.view(torch.bfloat16).view(8, 128)
                got = pages[("kv", part)][block, row * ROW_BYTES:(row + 1) * ROW_BYTES]
                assert torch.equal(got, values.view(torch.uint8))


@pytest.mark.parametrize("case", list(REAL))
def test_real_plans_bind_their_views_exactly(case: str) -> None:
    plan = real_plan(case)
    with on_cpu(plan) as pools:
        held = pools.allocations()
        pools_by_name = {pool.name: pool for pool in plan.pools}
        for (name, layer), buffer in held.items():
            pool = pools_by_name[name]
            assert buffer.numel() == pool.size
            assert (layer is None) == (pool.allocation == "whole")
        bound = pools.buffers()
        expected = 0
        for tensor in plan.tensors:
            pool = pools_by_name[tensor.pool]
            layers = tensor.layers if pool.allocation == "per_layer" else [None]
            for layer in layers:
                for view in tensor.views:
                    expected += 1
                    got = bound[(pool.name, layer, view.name)]
                    assert got.dtype == BUFFER_TORCH_DTYPES[view.dtype]
                    assert (list(got.shape), list(got.stride()), got.storage_offset()) == (
                        view.shape, view.strides, view.storage_offset)
                    storage = held[(pool.name, layer)].untyped_storage()
                    assert got.untyped_storage().data_ptr() == storage.data_ptr()
        assert len(bound) == expected


def test_the_hisparse_host_pool_is_a_host_mapping() -> None:
    plan = real_plan("hisparse")
    registrar = FakeRegistrar()
    with allocate(plan, device="cpu", pin=True, registrar=registrar,
                  register_chunk_bytes=2**20, prefault_threads=1) as pools:
        host = pools.allocation("hisparse_host")
        assert host.data_ptr() % 4096 == 0
        assert host.numel() == next(p.size for p in plan.pools if p.name == "hisparse_host")
        assert pools.pinned
        assert len(pools.chunks) > 1
        assert sum(chunk.nbytes for chunk in pools.chunks) == host.numel()
        assert registrar.base == host.data_ptr()
        assert pools.ram_counted == host.numel()
        assert "hisparse_host: host pool:" in pools.summary()
        assert verify(plan, pools).layers == 4
    assert registrar.registered == {}


def test_meta_pools_bind_everything_and_hold_nothing() -> None:
    plan = real_plan("hisparse")
    report = meta_check(plan)
    assert isinstance(report, SGLangMetaReport)
    sizes = {pool.name: pool.size for pool in plan.pools}
    assert report.host_bytes == sizes["hisparse_host"]
    assert report.device_bytes == 2 * (sizes["kv"] + sizes["index"])
    assert report.allocations == 5
    assert all(tensor.device.type == "meta" for tensor in report.buffers.values())
    assert report.pages == sum(len(t.layers) * len(t.ranges or []) for t in plan.tensors)
    big = plan_sglang(request(dsa_layers(4), max_total_tokens=2**22))
    assert meta_check(big).device_bytes > 2**30  # a full-size plan costs nothing on meta


def test_release_is_final() -> None:
    pools = on_cpu(hand_plan())
    pools.release()
    pools.release()
    assert pools.released
    with pytest.raises(BackendError, match="released"):
        pools.buffers()
    with pytest.raises(BackendError, match="released"):
        verify(hand_plan(), pools)


# --- refusals before anything is allocated ---------------------------------------------------


def _never(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("memory was touched for a plan that should have been refused")


def _v_range_into_next_block(plan: dict[str, Any]) -> None:
    plan["tensors"][0]["ranges"][1]["offset"] = HALF - 64


def _view_past_the_buffer(plan: dict[str, Any]) -> None:
    plan["tensors"][0]["views"][1]["storage_offset"] += 1


@pytest.mark.parametrize(("edit", "message"), [
    (_v_range_into_next_block, "share byte"),
    (_view_past_the_buffer, "view 'v_buffer' ends at byte"),
])
def test_an_unsound_plan_is_refused_before_allocation(
    edit: Edit, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pools_module, "allocate_device_pool", _never)
    monkeypatch.setattr(pools_module, "HostBuffer", _never)
    with pytest.raises(UnsoundPlanError, match=message) as caught:
        on_cpu(hand_plan(edit))
    assert isinstance(caught.value, hp.PlanInvariantError)


def test_too_little_ram_is_refused_naming_the_pools(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pools_module, "available_host_memory",
                        lambda: HostMemory(2**20, "test"))
    monkeypatch.setattr(pools_module, "allocate_device_pool", _never)
    with pytest.raises(HostMemoryError, match="the CPU device pools"):
        on_cpu(hand_plan())
    with pytest.raises(HostMemoryError, match="the host pools and the CPU device pools"):
        on_cpu(real_plan("hisparse"))


def test_too_little_gpu_memory_is_refused_naming_the_pools(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (2**20, 2**30))
    sizes: dict[tuple[str, str | None], int] = {
        ("kv", "l0"): 5 * 2**20, ("kv", "l1"): 5 * 2**20, ("index", "l0"): 2**20}
    with pytest.raises(BackendError, match=r"need .*kv 10485760 bytes, index 1048576 bytes"):
        pools_module._check_device_memory(sizes, torch.device("cuda", 0))


def test_bad_arguments_are_refused() -> None:
    plan = hand_plan()
    with pytest.raises(BackendError, match="prefault_threads"):
        allocate(plan, device="cpu", pin=False, prefault_threads=-1)
    with pytest.raises(BackendError, match="stage is 1"):
        allocate(plan, device="cpu", pin=False, stage=1)
    with pytest.raises(BackendError, match="one host pool marked shared"):
        allocate(plan, device="cpu", pin=False, host_pool_name="x")
    with pytest.raises(BackendError, match="device is 'gpu'"):
        allocate(plan, device="gpu", pin=False)
    with on_cpu(plan) as pools:
        with pytest.raises(BackendError, match="blocks is 0"):
            verify(plan, pools, blocks=0)
        with pytest.raises(BackendError, match="no allocation pool 'kv' \\(layer 'l7'\\)"):
            pools.allocation("kv", "l7")
        with pytest.raises(BackendError, match="has no pages"):
            pools.pages("l7")
    with allocate(plan, device="meta", pin=False) as pools, pytest.raises(
        BackendError, match="meta pools hold no bytes"
    ):
        verify(plan, pools)


# --- verify ----------------------------------------------------------------------------------


def test_the_hand_built_plan_verifies_every_block_and_a_sample() -> None:
    plan = hand_plan()
    full = run(plan)
    assert (full.groups, full.layers, full.pages, full.bytes, full.sampled) == (
        2, 2, 2 * 2 * (ROWS // PAGE), 2 * 2 * (ROWS // PAGE) * PAGE * ROW_BYTES, False)
    sample = run(plan, blocks=3)
    assert sample.sampled
    assert sample.pages < full.pages


@pytest.mark.parametrize("case", list(REAL))
def test_real_plans_verify_every_block(case: str) -> None:
    plan = real_plan(case)
    report = run(plan)
    assert not report.sampled
    pools = {pool.name: pool for pool in plan.pools}
    assert report.pages == sum(
        len(t.layers) * len(t.ranges or []) * pools[t.pool].num_blocks for t in plan.tensors)
    assert run(plan, blocks=2).sampled


def test_progress_counts_allocations() -> None:
    calls: list[tuple[str, int, int]] = []
    plan = real_plan("dsa")
    with on_cpu(plan) as pools:
        verify(plan, pools, progress=lambda step, done, total: calls.append((step, done, total)))
    assert calls == [("verify", done, 4) for done in range(5)]


# Tampered plans, verified on the pools of the sound plan: caught on real bytes, the static
# checker never asked.


def test_a_v_range_into_the_next_block_is_caught() -> None:
    with pytest.raises(VerifyError, match=r"verify failed \(page -> allocation\)") as caught:
        run(hand_plan(_v_range_into_next_block), on=hand_plan())
    error = caught.value
    assert (error.tensor, error.layer) == (0, "l0")
    assert "range 0 in pool 'kv' (layer 'l0')" in str(error)
    assert error.byte_offset == HALF - 64


def test_blocks_overlapping_are_caught() -> None:
    def halve(plan: dict[str, Any]) -> None:
        plan["tensors"][0]["block_stride"] //= 2

    with pytest.raises(VerifyError, match="shares that byte") as caught:
        run(hand_plan(halve), on=hand_plan())
    # Block 1 now starts half way into block 0's range, and is written after it.
    assert (caught.value.block, caught.value.byte_offset) == (0, PAGE * ROW_BYTES // 2)


def test_layers_overlapping_in_a_whole_pool_are_caught() -> None:
    plan = real_plan("mamba")
    index = next(i for i, t in enumerate(plan.tensors) if t.pool == "mamba_temporal")

    def overlap(dumped: dict[str, Any]) -> None:
        dumped["tensors"][index]["layer_stride"] //= 2

    bad = SGLangPlan.model_validate(_edited(plan, overlap))
    with pytest.raises(VerifyError) as caught:
        run(bad, on=plan)
    assert caught.value.tensor == index
    assert "pool 'mamba_temporal'" in str(caught.value)


def test_a_block_stride_of_zero_is_named() -> None:
    def collapse(plan: dict[str, Any]) -> None:
        plan["tensors"][0]["block_stride"] = 0

    with pytest.raises(VerifyError, match="blocks 0 and 1 share every byte") as caught:
        run(hand_plan(collapse), on=hand_plan())
    assert (caught.value.tensor, caught.value.block) == (0, 1)


def test_a_range_past_the_allocation_is_refused() -> None:
    def shift(plan: dict[str, Any]) -> None:
        plan["tensors"][0]["ranges"][1]["offset"] = HALF + 64

    with pytest.raises(BackendError, match=r"tensors\[0\] layer 'l0' range 1 in pool 'kv' "
                                           r"\(layer 'l0'\): block 16's part ends at byte"):
        run(hand_plan(shift), on=hand_plan())


def test_a_view_across_two_pages_is_caught() -> None:
    # The last head of K token 63 would run one element into page 1: SGLang's rows must each
    # lie in one page. check_plan refuses it; verify, which trusts no plan, finds it on bytes.
    def nudge(plan: dict[str, Any]) -> None:
        plan["tensors"][0]["views"][0]["storage_offset"] = 1

    plan = hand_plan(nudge)
    with pytest.raises(hp.PlanInvariantError):
        hp.check_plan(plan)
    with pytest.raises(VerifyError, match=r"buffer inside pages.*row \[63, 7\]") as caught:
        run(plan, on=hand_plan())
    assert caught.value.byte_offset == 2 + 63 * ROW_BYTES + 7 * 256


def test_a_tensor_that_reads_elsewhere_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    # The raw side never uses the bound tensor: heads and dims swapped is caught on the bytes
    # (the structural check, which would name it first, is switched off here).
    bind = binding_module.bind_buffer

    def swapped(placed: Any, allocation: torch.Tensor) -> torch.Tensor:
        tensor = bind(placed, allocation)
        if placed.view.name != "v_buffer":
            return tensor
        return tensor.as_strided((ROWS, 8, 128), (tensor.stride(0), 1, 8),
                                 tensor.storage_offset())

    monkeypatch.setattr(verify_module, "bind_buffer", swapped)
    monkeypatch.setattr(verify_module, "check_buffer", lambda *args: None)
    with pytest.raises(VerifyError, match=r"verify failed \(buffer\): view 'v_buffer'"):
        run(hand_plan())


def test_the_structural_check_names_a_wrong_stride(monkeypatch: pytest.MonkeyPatch) -> None:
    bind = binding_module.bind_buffer

    def wrong(placed: Any, allocation: torch.Tensor) -> torch.Tensor:
        tensor = bind(placed, allocation)
        return tensor.as_strided(tensor.shape, (1024, 1, 8), tensor.storage_offset())

    monkeypatch.setattr(verify_module, "bind_buffer", wrong)
    with pytest.raises(BackendError,
                       match=r"strides is \[1024, 1, 8\]; expected \[1024, 128, 1\]"):
        run(hand_plan())


def test_a_corrupted_byte_is_reported_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    read = read_raw
    page = PAGE * ROW_BYTES

    def flaky(layer: Any, ids: torch.Tensor) -> torch.Tensor:
        got = read(layer, ids).clone()
        if layer.view.name == "l1" and layer.view.offset == HALF:
            row = (ids == 5).nonzero().flatten()
            got[row, 1000] ^= 0x10
        return got

    monkeypatch.setattr(verify_module, "read_raw", flaky)
    with pytest.raises(VerifyError) as caught:
        run(hand_plan())
    error = caught.value
    assert (error.tensor, error.layer, error.block, error.byte_offset) == (
        0, "l1", 5, HALF + 5 * page + 1000)
    assert "holds 0x" in str(error)
    assert "expected 0x" in str(error)


def test_a_plan_placing_pages_the_pools_lack_is_refused() -> None:
    def add_layer(plan: dict[str, Any]) -> None:
        plan["tensors"][0]["layers"].append("l2")

    with pytest.raises(BackendError, match="pool 'kv' \\(layer 'l2'\\), which these pools do not"):
        run(hand_plan(add_layer), on=hand_plan())


def test_a_kind_mismatch_is_refused() -> None:
    from support.golden import load

    vllm = hp.plan(load("bf16_small_with_full_attention")[0])
    with on_cpu(hand_plan()) as pools, pytest.raises(BackendError, match="KVCachePlan with "
                                                                         "SGLangPools"):
        verify(vllm, pools)


def _edited(plan: SGLangPlan, edit: Edit) -> dict[str, Any]:
    dumped = plan.model_dump(mode="json")
    edit(dumped)
    return dumped
