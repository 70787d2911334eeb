"""The block_outermost host pool (hisparse.host_pool_layout, docs/transfer.md#placement-that-
transfers-well): planned BLNHC, proved by check_plan with the placement pinned, refused by the
engines whose runtime lays the pool out otherwise, and moved from a block-outermost prefill in
one descriptor per block and destination pool."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from pydantic import ValidationError

import hisparse_plan as hp
from hisparse_plan.cli.main import main
from hisparse_plan.exchange.transfer import Instance, TransferRequest, build_transfer
from hisparse_plan.exchange.transfer.proof.check import check_transfer
from hisparse_plan.models import KVCacheLayout, PlanRequest
from hisparse_plan.presets import ConfigError, Settings, build_request, load_preset
from hisparse_plan.views import plan_views
from support.transfer_support import count_wrong, deepseek_plan

SOURCE = "model.layers.{}.self_attn.attn"


def _request(layout: str = "block_outermost") -> dict[str, Any]:
    """DeepSeek-V3.2's first three decoder layers with a small host pool."""
    request = build_request(load_preset("deepseek-v3.2").architecture, Settings(
        max_model_len=1024, hisparse=True, host_pool_bytes=2**22, gpu_mem_bytes=2**25,
    )).model_dump(mode="json")
    keep = tuple(f"model.layers.{i}." for i in range(3))
    request["layers"] = {name: spec for name, spec in request["layers"].items()
                         if name.startswith(keep)}
    request["hisparse"]["host_pool_layout"] = layout
    return request


def _plan(layout: str = "block_outermost") -> hp.KVCachePlan:
    plan = hp.plan(PlanRequest.model_validate(_request(layout)))
    assert isinstance(plan, hp.KVCachePlan)
    return plan


def _refused(plan: hp.KVCachePlan, edit: Any, match: str) -> None:
    dumped = copy.deepcopy(plan.model_dump(mode="json"))
    edit(dumped)
    with pytest.raises(hp.PlanInvariantError, match=match):
        hp.check_plan(hp.KVCachePlan.model_validate(dumped))


def test_each_block_holds_every_source_page_back_to_back() -> None:
    plan = _plan()
    host = plan.host_pool
    assert host is not None
    assert host.layout is KVCacheLayout.BLNHC
    page = 64 * 656  # 64 tokens of DeepSeek-V3.2's 656-byte fp8 latent rows
    assert host.bytes_per_block == 3 * page
    hp.check_plan(plan, request=_request())
    views = plan_views(plan)
    for position in range(3):
        view = views[SOURCE.format(position)]
        assert view.host_resident
        # Block b of layer i: i pages into the b-th slab of three pages.
        for block in (0, 1, host.num_blocks - 1):
            assert view.offset + block * view.block_stride == block * 3 * page + position * page
    # The default keeps vLLM's layer-outermost pool: layer i's slab, then block b in it.
    default = _plan("layer_outermost")
    assert default.host_pool is not None
    assert default.host_pool.layout is KVCacheLayout.LBNHC
    view = plan_views(default)[SOURCE.format(2)]
    assert view.offset == 2 * page * default.host_pool.num_blocks
    assert view.block_stride == page


def test_the_plan_summary_says_block_outermost() -> None:
    from hisparse_plan.targets.vllm.pipeline import summary

    assert "block-outermost" in summary(_plan())
    assert "block-outermost" not in summary(_plan("layer_outermost"))


def test_check_plan_refuses_a_sound_placement_that_does_not_line_up() -> None:
    plan = _plan()
    host = plan.host_pool
    assert host is not None
    page = host.bytes_per_block // 3

    def layer_outermost_strides(dumped: dict[str, Any]) -> None:
        # vLLM's LBNHC placement: sound (no byte shared, inside the pool), not lined up.
        dumped["tensors"][0]["layer_stride"] = page * host.num_blocks
        dumped["tensors"][0]["block_stride"] = page

    _refused(plan, layer_outermost_strides, r"tensors\[0\]\.layer_stride is \d+; expected "
             f"{page} in the BLNHC host pool")
    def layers_swapped(dumped: dict[str, Any]) -> None:
        # Sound: the pages of one block in another order than the source group's.
        layers = dumped["tensors"][0]["layers"]
        dumped["tensors"][0]["layers"] = [layers[1], layers[0], *layers[2:]]

    _refused(plan, layers_swapped, r"the BLNHC host block's page 0 is layer "
             r"'model\.layers\.1\.self_attn\.attn'; expected 'model\.layers\.0\.self_attn\.attn'")
    _refused(plan, lambda d: d["host_pool"].update(layout="LBHNC"),
             r"host_pool\.layout is LBHNC; expected LBNHC .* or BLNHC")
    _refused(plan, lambda d: d["tensors"][0].update(offset=656), "host pool")


def test_check_plan_refuses_a_block_with_room_left() -> None:
    plan = _plan()
    host = plan.host_pool
    assert host is not None

    def roomier(dumped: dict[str, Any]) -> None:
        # Blocks a page apart more than the pages take: sound, but a run of blocks is not one
        # range.
        grown = host.bytes_per_block + 656 * 64
        dumped["host_pool"].update(bytes_per_block=grown, block_stride=grown,
                                   size=grown * host.num_blocks)
        for pool in dumped["pools"]:
            if pool["name"] == "host":
                pool["size"] = grown * host.num_blocks
        dumped["tensors"][0].update(block_stride=grown, size=grown * host.num_blocks)

    _refused(plan, roomier, "host_pool.bytes_per_block|fill")


def test_the_option_is_validated_and_reaches_the_request() -> None:
    bad = _request()
    bad["hisparse"]["host_pool_layout"] = "BLNHC"
    with pytest.raises(ValidationError, match="host_pool_layout"):
        PlanRequest.model_validate(bad)
    with pytest.raises(ConfigError, match=r"Settings\.host_pool_layout"):
        Settings(host_pool_layout="blocks")  # type: ignore[arg-type]
    request = build_request(load_preset("deepseek-v3.2").architecture,
                            Settings(host_pool_layout="block_outermost"))
    assert request.hisparse is not None
    assert request.hisparse.host_pool_layout == "block_outermost"
    with pytest.raises(ConfigError, match="host_pool_layout"):
        build_request(load_preset("llama-3-8b").architecture,
                      Settings(host_pool_layout="block_outermost"))


def test_plan_takes_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "deepseek-v3.2", "--host-pool-layout", "block_outermost",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["host_pool"]["layout"] == "BLNHC"


def test_the_vllm_adapter_refuses_it_naming_the_option() -> None:
    from hisparse_plan.adapters.vllm import to_kv_cache_config

    with pytest.raises(hp.PlanError, match=r"hisparse\.host_pool_layout.*"
                       r"docs/transfer\.md#placement-that-transfers-well") as refused:
        to_kv_cache_config(_plan())
    assert refused.value.field == "hisparse.host_pool_layout"


def test_sglang_refuses_the_option_by_name() -> None:
    request = _request()
    request["hisparse"]["host_pool_layout"] = "block_outermost"
    request["engine"] = {"name": "sglang", "context_length": 1024, "enable_hisparse": True}
    with pytest.raises(hp.PlanError, match=r"hisparse\.host_pool_layout") as refused:
        hp.plan_for_engine(request)
    assert refused.value.field == "hisparse.host_pool_layout"


@pytest.mark.parametrize("runs", [False, True])
def test_a_block_outermost_prefill_moves_in_one_descriptor_per_block_and_pool(runs: bool) -> None:
    """Latent pages: one slab of the prefill's block to one host block; index keys: one slab to
    the device block. With vLLM's host pool each layer's page is a descriptor of its own."""
    prefill = Instance([deepseek_plan(layers=2)], cache_dtype="fp8_e4m3")
    counts = {}
    for layout in ("layer_outermost", "block_outermost"):
        decode = Instance([deepseek_plan(layers=2, hisparse=True, host_layout=layout)],
                          cache_dtype="fp8_e4m3")
        step = 2 if runs else 1
        request = TransferRequest(
            num_tokens=640, source_blocks={"group.0": [1 + step * i for i in range(10)]},
            destination_blocks={"group.0": list(range(1, 11)),
                                "group.1": list(range(3, 13))})
        program = build_transfer(prefill, decode, request)
        check_transfer(program, prefill, decode)
        assert count_wrong(prefill, decode, request, program) == 0
        counts[layout] = program.descriptors
    # 10 blocks of 2 layers: before, a latent page per layer and block (the index pages of a
    # block are one slab on both sides); after, a latent slab and an index slab per block.
    assert counts == {"layer_outermost": 10 * (2 + 1), "block_outermost": 10 * 2}


def test_the_torch_backend_binds_and_verifies_it_on_real_bytes() -> None:
    pytest.importorskip("torch")
    from hisparse_plan.torch import allocate, verify

    plan = _plan()
    assert plan.host_pool is not None
    with allocate(plan, device="cpu", pin=False, prefault_threads=0) as pools:
        report = verify(plan, pools)
        views = pools.views()
        page = plan.host_pool.bytes_per_block // 3
        # Each host layer's view is a page a block apart by the slab: the host pool's bytes
        # of block b, layer i are that view's block b.
        host = pools.host
        assert host is not None
        base = host.data_ptr()
        for position in range(3):
            view = views[SOURCE.format(position)]
            assert view.stride(0) * view.element_size() == plan.host_pool.bytes_per_block
            assert view.data_ptr() - base == position * page
    assert report.layers == len(plan_views(plan))
    assert not report.sampled


def test_source_layers_of_two_specs_keep_vllms_order() -> None:
    """Source layers 0 and 2 of another cache format: vLLM places a group's layers by spec in
    order of first appearance (0, 2, then 1), in the prefill as in the host pool."""
    request = _request()
    name = SOURCE.format(1)
    request["layers"][name] = {**request["layers"][name], "cache_dtype": "variant"}
    plan = hp.plan(PlanRequest.model_validate(request))
    assert [t.layers for t in plan.tensors if t.host_resident] == [
        [SOURCE.format(0), SOURCE.format(2)], [SOURCE.format(1)]]
    hp.check_plan(plan, request=request)


def test_the_torch_executor_fills_the_block_outermost_pool_allocate_made() -> None:
    """A request moved with the proved pattern (execute_request) into pools allocated for the
    option's plan: every token of every layer read back through the decode's views is the
    prefill's, read through its own."""
    torch = pytest.importorskip("torch")
    from hisparse_plan.exchange.transfer import check_pattern, compile_transfer
    from hisparse_plan.exchange.transfer.facts.side import rank_facts
    from hisparse_plan.torch import allocate, transfer_regions, verify
    from hisparse_plan.torch.transfer import execute_request

    prefill, decode = deepseek_plan(layers=2), deepseek_plan(
        layers=2, hisparse=True, host_layout="block_outermost")
    assert isinstance(prefill, hp.KVCachePlan)
    assert isinstance(decode, hp.KVCachePlan)
    src, dst = Instance([prefill], cache_dtype="fp8_e4m3"), Instance([decode],
                                                                       cache_dtype="fp8_e4m3")
    tokens = 300  # five blocks, the last partly used
    request = TransferRequest(num_tokens=tokens, source_blocks={"group.0": [9, 3, 4, 5, 1]},
                              destination_blocks={"group.0": [2, 3, 4, 7, 6],
                                                  "group.1": [5, 1, 2, 3, 9]})
    pattern = compile_transfer(src, dst)
    check_pattern(pattern, src, dst)
    made = pattern.instantiate(request)
    generator = torch.Generator().manual_seed(41)
    with allocate(prefill, device="cpu", pin=False) as ours, \
            allocate(decode, device="cpu", pin=False) as theirs:
        ours.device.copy_(torch.randint(0, 256, ours.device.shape, generator=generator,
                                        dtype=torch.uint8))
        execute_request(made, transfer_regions(ours, pattern.source[0]),
                        transfer_regions(theirs, pattern.destination[0]))
        sent, got = ours.views(), theirs.views()
        tables = rank_facts(prefill).layers
        for name, fact in rank_facts(decode).layers.items():
            def rows(view: Any, blocks: list[int]) -> Any:
                pages = view[torch.tensor(blocks)]
                return pages.reshape(len(blocks) * view.shape[2], -1)[:tokens]

            if fact.kind == "pages":  # index keys: whole pages
                assert torch.equal(sent[name][request.source_blocks[tables[name].table]],
                                   got[name][request.destination_blocks[fact.table]]), name
            else:
                assert torch.equal(rows(sent[name], request.source_blocks[tables[name].table]),
                                   rows(got[name], request.destination_blocks[fact.table])), name
        assert verify(decode, theirs).layers == len(plan_views(decode))
