"""The NIXL executor between two processes on one machine (DRAM to DRAM over UCX, no GPU):
the decode process registers its regions, the prefill process writes the program's rows
into them, and every byte lands where the decode's own views place it. Skipped without
nixl-cu12 (pip install --no-deps nixl-cu12==1.5.1)."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from functools import partial
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import pytest

import hisparse_plan as hp
from hisparse_plan.exchange.transfer import (
    Instance,
    TransferRequest,
    build_transfer,
    check_pattern,
    compile_transfer,
)
from hisparse_plan.exchange.transfer.executors.nixl_direct import descriptors, endpoint, post
from hisparse_plan.exchange.transfer.executors.reference import addresses as reference_addresses
from hisparse_plan.exchange.transfer.executors.reference import buffers
from hisparse_plan.exchange.transfer.pattern.instance import Instantiated
from hisparse_plan.exchange.transfer.pattern.transfer_pattern import TransferPattern
from support.transfer_support import deepseek_plan, oracle, request_blocks, wrong_bytes

pytest.importorskip("nixl_cu12")


def decode_process(destination: Any, pipe: Connection) -> None:
    """Hold the destination's regions (as the oracle starts them), registered with NIXL,
    until the prefill says it is done; then hand the bytes back."""
    regions = buffers(destination, fill=None, seed=2)
    addresses = reference_addresses(regions)
    side = endpoint("decode", addresses)
    pipe.send((side.metadata, addresses))
    pipe.recv()
    pipe.send({key: value.tobytes() for key, value in regions.items()})


Addresses = dict[tuple[int, str], tuple[int, int]]


def into_decode_process(destination: Any, source: dict[tuple[int, str], np.ndarray],
                        post_rows: Callable[[Addresses, bytes, Addresses], None]
                        ) -> dict[tuple[int, str], np.ndarray]:
    """Start a decode process holding `destination`'s regions, let `post_rows(our addresses,
    its metadata, its addresses)` write into them, and return its regions' bytes after."""
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    child = context.Process(target=decode_process, args=(destination, theirs))
    child.start()
    try:
        metadata, remote = ours.recv()
        addresses = reference_addresses(source)
        post_rows(addresses, metadata, remote)
        ours.send("done")
        received = ours.recv()
    finally:
        child.join(timeout=30)
        if child.is_alive():
            child.terminate()
    return {key: np.frombuffer(value, dtype=np.uint8) for key, value in received.items()}


def test_nixl_moves_a_deepseek_request_between_two_processes() -> None:
    src = Instance([deepseek_plan(hisparse=False, layers=2)])
    dst = Instance([deepseek_plan(hisparse=True, layers=2)])
    request = TransferRequest(num_tokens=300, source_blocks=request_blocks(src, 300, 1),
                              destination_blocks=request_blocks(dst, 300, 2))
    program = build_transfer(src, dst, request)
    source, _, expected, allowed = oracle(src, dst, request, program)

    def post_program(addresses: Addresses, metadata: bytes, remote: Addresses) -> None:
        posted = post(endpoint("prefill", addresses), metadata, program, remote)
        assert posted == program.descriptors

    after = into_decode_process(program.destination, source, post_program)
    assert wrong_bytes(after, expected, allowed) == 0


def test_descriptors_are_one_per_contiguous_copy() -> None:
    src = Instance([deepseek_plan(hisparse=False, layers=2)])
    request = TransferRequest(num_tokens=128, source_blocks={"group.0": [3, 4]},
                              destination_blocks={"group.0": [7, 8]})
    program = build_transfer(src, src, request)
    plan = src.plans[0]
    assert isinstance(plan, hp.KVCachePlan)
    slab = plan.device_pool.bytes_per_block
    regions = {(0, "device"): (1 << 20, plan.pools[0].size)}
    local, remote = descriptors(program, regions, {(0, "device"): (1 << 30, 10**9)})
    # Both sides block-outermost in one layout: two consecutive blocks, one copy.
    assert len(local) == len(remote) == program.descriptors == 1
    assert local[0].tolist() == [(1 << 20) + 3 * slab, 2 * slab, 0]
    assert remote[0].tolist() == [(1 << 30) + 7 * slab, 2 * slab, 0]


def post_prepared(pattern: TransferPattern, made: Instantiated, strided: bool, name: str,
                  addresses: Addresses, metadata: bytes, remote: Addresses) -> None:
    """Prepare both sides' lists from the pattern, then post the instantiated request."""
    from hisparse_plan.exchange.transfer.executors import nixl_prepared

    side = endpoint(name, addresses, progress_thread=strided)
    prepared = nixl_prepared.prepare(side, metadata, pattern, remote, strided=strided)
    local, far = nixl_prepared.indices(prepared, made)
    assert len(local) == len(far) == made.chunks
    assert nixl_prepared.post(side, prepared, made) == made.chunks


def test_nixl_posts_instantiated_requests_from_prepared_lists() -> None:
    """Lists prepared once from the proved pattern (strided, then dense); two requests (of
    other lengths and blocks) posted with make_prepped_xfer into a decode process, each
    checked."""
    src = Instance([deepseek_plan(hisparse=False, layers=2)])
    dst = Instance([deepseek_plan(hisparse=True, layers=2)])
    pattern = compile_transfer(src, dst)
    check_pattern(pattern, src, dst)
    for tokens, seed, strided in ((300, 1, True), (129, 5, False)):
        request = TransferRequest(num_tokens=tokens,
                                  source_blocks=request_blocks(src, tokens, seed, runs=True),
                                  destination_blocks=request_blocks(dst, tokens, seed + 1))
        made = pattern.instantiate(request)
        source, _, expected, allowed = oracle(src, dst, request, made.program())
        post_rows = partial(post_prepared, pattern, made, strided, f"prefill{tokens}")
        after = into_decode_process(pattern.destination, source, post_rows)
        assert wrong_bytes(after, expected, allowed) == 0
