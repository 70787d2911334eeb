"""verify's two ways to reach the raw pool agree: strided views of consecutive blocks, and the
index gather/scatter of any block selection (both from the plan's integers alone)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")  # the backend is an extra: skip without it

import hisparse_plan as hp
from hisparse_plan.torch import allocate
from hisparse_plan.torch.verify_layers import (
    Layer,
    Scratch,
    _disjoint,
    prepare_layer,
    read_raw,
    select_blocks,
    write_raw,
)
from hisparse_plan.torch.vllm.binding import bind_views
from hisparse_plan.torch.vllm.pools import Pools
from hisparse_plan.views import plan_views
from support.torch_support import qwen3_next_small_request, small_plan, torch


def layers_of(plan: hp.KVCachePlan, pools: Pools) -> list[Layer]:
    host, device = pools.host, pools.device
    bound = bind_views(plan, host, device, None)
    prepared = []
    for key, (name, view) in enumerate(plan_views(plan).items()):
        pool = host if view.host_resident and host is not None else device
        selection = select_blocks(view.num_blocks, None, pool.device)
        prepared.append(prepare_layer(view, key, bound[name], pool, selection, 2**16,
                                      Scratch(pool.device)))
    return prepared


@pytest.mark.parametrize("plan", [small_plan(), hp.plan(qwen3_next_small_request())],
                         ids=["hisparse", "qwen3-next"])
def test_strided_and_gathered_raw_pages_agree(plan: hp.KVCachePlan) -> None:
    with allocate(plan, device="cpu", pin=False, prefault_threads=0) as pools:
        for pool in (pools.host, pools.device):
            if pool is not None:
                pool.copy_(torch.randint(0, 256, pool.shape, dtype=torch.uint8))
        for layer in layers_of(plan, pools):
            for _, ids in list(layer.batches())[:2]:  # the first batches are enough
                strided = read_raw(layer, ids)  # a slice of the selection: consecutive
                gathered = read_raw(layer, ids.clone())  # a copy: the gather
                assert torch.equal(strided, gathered)
                pages = torch.randint(0, 256, strided.shape, dtype=torch.uint8)
                write_raw(layer, ids, pages)
                assert torch.equal(read_raw(layer, ids.clone()), pages)
                write_raw(layer, ids.clone(), pages.flip(0))
                assert torch.equal(read_raw(layer, ids), pages.flip(0))


@pytest.mark.parametrize(("row", "dims", "disjoint"), [
    (64, [(4, 64)], True),
    (64, [(4, 32)], False),  # rows overlap
    (64, [(2, 1024), (4, 64)], True),  # blocks outside heads outside rows
    (64, [(2, 200), (4, 64)], False),  # a block stride inside the 256-byte page
    (64, [(1, 0), (4, 64)], True),  # an axis of one entry repeats nothing
])
def test_disjoint(row: int, dims: list[tuple[int, int]], disjoint: bool) -> None:
    assert _disjoint(row, dims) is disjoint
