"""Staged transfers (docs/transfer.md#staged-transfers): slabs and staging areas made from a
proved pattern, proved by check_staged, chosen by the cost model, posted with NIXL between two
processes (phase 1) and rearranged by the destination (phase 2). The random pairs are in
test_transfer_pattern; these pin the DeepSeek-V3.2 and Llama figures, computed here from the
models' own sizes."""

from __future__ import annotations

import multiprocessing
from multiprocessing.connection import Connection

import numpy as np
import pytest

from hisparse_plan.exchange.transfer import (
    Instance,
    TransferCheckError,
    TransferRequest,
    compile_transfer,
)
from hisparse_plan.exchange.transfer.executors.rearrange import rearrange
from hisparse_plan.exchange.transfer.executors.reference import addresses, buffers
from hisparse_plan.exchange.transfer.pattern.check_staged import check_staged
from hisparse_plan.exchange.transfer.pattern.cost import LinkCosts, choose
from hisparse_plan.exchange.transfer.pattern.staging import StagedPattern, compile_staged, slots_for
from support.transfer_support import (
    attention_layers,
    deepseek_plan,
    oracle,
    request_blocks,
    vllm_plan,
    wrong_bytes,
)

LATENT, INDEX, TOKENS = 656, 132, 64
"""fp8_ds_mla's latent row, an index key with its scale, a block's tokens."""


def deepseek_pair(layers: int = 2) -> tuple[Instance, Instance]:
    return (Instance([deepseek_plan(hisparse=False, layers=layers)]),
            Instance([deepseek_plan(hisparse=True, layers=layers)]))


def test_a_blnhc_block_is_one_slab_of_all_its_layers() -> None:
    src, dst = deepseek_pair(layers=3)
    staged = compile_staged(compile_transfer(src, dst), 8)
    proof = check_staged(staged, src, dst)
    block = 3 * TOKENS * (LATENT + INDEX)
    assert [(s.offset, s.length, s.block_stride) for s in staged.slabs] == [(0, block, block)]
    assert proof.slab_bytes == block
    assert proof.unread_bytes == 0
    assert staged.staging_bytes == [8 * block]
    # Most of a block lands in the decode's pinned host pool: staging sits beside it.
    assert staged.staging_location == "host"


def test_the_cost_model_weighs_copies_against_a_second_local_copy() -> None:
    src, dst = deepseek_pair(layers=3)
    staged = compile_staged(compile_transfer(src, dst), 8)
    block = 3 * TOKENS * (LATENT + INDEX)
    costs = LinkCosts(per_copy_s=5e-6, link_bytes_per_s=1e10, local_bytes_per_s=2e10)
    choice = choose(staged, costs, run_blocks=16)
    # Direct: one copy per layer's latent rows (the host pool is layer-outermost) and one
    # for the index keys (the device pool packs them per block).
    assert choice.direct_copies == 3 + 1
    assert choice.direct_s == pytest.approx(4 * 5e-6 + block / 1e10)
    assert choice.staged_s == pytest.approx(5e-6 / 16 + block / 1e10 + block / 2e10)
    assert choice.staged is (5e-6 / 16 + block / 2e10 < 4 * 5e-6)
    assert choose(staged, LinkCosts(5e-6, 1e10, 1e15)).staged


def test_a_row_wider_than_its_block_is_cut_into_its_chunks() -> None:
    """Layer-outermost pools: a row steps across the layer axis, past the block stride; the
    staged pattern cuts it into per-layer rows, one slab each."""
    src = Instance([deepseek_plan(hisparse=False, layers=2, layout="LBNHC")])
    dst = Instance([deepseek_plan(hisparse=False, layers=2, layout="BLNHC")])
    pattern = compile_transfer(src, dst)
    staged = compile_staged(pattern, 4)
    check_staged(staged, src, dst)
    assert any(row.count > 1 and row.src_stride > row.src_block_stride for row in pattern.rows)
    assert all(row.count == 1 or row.src_stride * (row.count - 1) + row.length
               <= row.src_block_stride for row in staged.pattern.rows)
    assert all(s.length <= s.block_stride for s in staged.slabs)


def test_a_slab_holding_another_blocks_bytes_is_refused() -> None:
    """Tensor parallel 1 -> 2: rank 0 reads half of every token's heads, so its slab has
    bytes no row reads, which are its block's; one that reaches into the next block is
    refused."""
    src = Instance([vllm_plan(attention_layers(1, 4))], total_kv_heads=4)
    half = vllm_plan(attention_layers(1, 2))
    dst = Instance([half, half], total_kv_heads=4)
    staged = compile_staged(compile_transfer(src, dst), 2)
    proof = check_staged(staged, src, dst)
    assert proof.unread_bytes > 0
    # Rank 1's slab starts past the block's first byte; a block stride long, its end holds
    # the first bytes of the next block.
    slab = max(staged.slabs, key=lambda s: s.offset)
    assert slab.offset > 0
    assert slab.offset + slab.length == slab.block_stride
    shifted = slab.model_copy(update={"length": slab.block_stride})
    edited = staged.model_copy(update={"slabs": [shifted if s is slab else s
                                                 for s in staged.slabs]})
    with pytest.raises(TransferCheckError, match="another block"):
        check_staged(edited, src, dst)


def test_a_request_larger_than_the_staging_area_moves_in_rounds() -> None:
    src, dst = deepseek_pair()
    pattern = compile_transfer(src, dst)
    staged = compile_staged(pattern, 3)
    request = TransferRequest(num_tokens=600, source_blocks=request_blocks(src, 600, 1,
                                                                           runs=True),
                              destination_blocks=request_blocks(dst, 600, 2))
    made = staged.instantiate(request)
    assert len(made.rounds) == 4  # 10 blocks, 3 a round
    assert [r.phase1.slab.size for r in made.rounds] == [3, 3, 3, 1]
    assert sum(r.entries for r in made.rounds) == made.direct.entries
    assert slots_for(pattern, staged.staging_bytes[0]) == 3


def test_the_staged_pattern_is_json_and_back() -> None:
    src, dst = deepseek_pair()
    staged = compile_staged(compile_transfer(src, dst), 4)
    again = StagedPattern.model_validate_json(staged.model_dump_json())
    assert again == staged
    check_staged(again, src, dst)


def staged_decode_process(staged_json: str, request_json: str, pipe: Connection) -> None:
    """The decode: its regions (random, seed 2) and a staging region registered with NIXL;
    after each round's phase 1 it rearranges that round; then it hands its bytes back."""
    from hisparse_plan.exchange.transfer.executors.nixl_direct import endpoint

    staged = StagedPattern.model_validate_json(staged_json)
    made = staged.instantiate(TransferRequest.model_validate_json(request_json))
    regions = buffers(staged.pattern.destination, fill=None, seed=2)
    staging = buffers(made.staging_regions(), fill=0)
    registered = addresses({**regions, **staging})
    side = endpoint("staged-decode", registered)
    pipe.send((side.metadata, registered))
    while (number := pipe.recv()) is not None:
        rearrange(made.rounds[number], made, staging, regions)
        pipe.send(number)
    pipe.send({key: value.tobytes() for key, value in regions.items()})


def test_nixl_stages_a_request_into_another_process() -> None:
    pytest.importorskip("nixl_cu12")
    from hisparse_plan.exchange.transfer.executors.nixl_direct import endpoint
    from hisparse_plan.exchange.transfer.executors.nixl_staged import post_round

    src, dst = deepseek_pair()
    staged = compile_staged(compile_transfer(src, dst), 4)
    check_staged(staged, src, dst)
    request = TransferRequest(num_tokens=700, source_blocks=request_blocks(src, 700, 3,
                                                                           runs=True),
                              destination_blocks=request_blocks(dst, 700, 4, runs=True))
    made = staged.instantiate(request)
    source, _, expected, allowed = oracle(src, dst, request, made.direct.program())
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    child = context.Process(target=staged_decode_process,
                            args=(staged.model_dump_json(), request.model_dump_json(), theirs))
    child.start()
    try:
        metadata, remote = ours.recv()
        side = endpoint("staged-prefill", addresses(source))
        peer = side.agent.add_remote_agent(metadata)
        posted = 0
        for number, round_ in enumerate(made.rounds):
            posted += post_round(side, peer, made, round_, remote)
            ours.send(number)
            assert ours.recv() == number
        ours.send(None)
        after = {key: np.frombuffer(value, dtype=np.uint8)
                 for key, value in ours.recv().items()}
    finally:
        child.join(timeout=30)
        if child.is_alive():
            child.terminate()
    assert len(made.rounds) > 1
    assert posted < made.direct.chunks
    assert wrong_bytes(after, expected, allowed) == 0
