"""Prepared NIXL lists initiated by the destination (pull: it READs, NIXL's notification
tells the source), between two processes on one machine (DRAM to DRAM over UCX, no GPU).
Skipped without nixl-cu12."""

from __future__ import annotations

import multiprocessing
import time
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import pytest

from hisparse_plan.exchange.transfer import (
    Instance,
    TransferRequest,
    check_pattern,
    compile_transfer,
)
from hisparse_plan.exchange.transfer.executors.nixl_direct import endpoint, run_to_done
from hisparse_plan.exchange.transfer.executors.reference import addresses as region_addresses
from hisparse_plan.exchange.transfer.executors.reference import buffers
from support.transfer_support import deepseek_plan, oracle, request_blocks, wrong_bytes

pytest.importorskip("nixl_cu12")


def source_process(source: dict[tuple[int, str], bytes], pipe: Connection) -> None:
    """Hold the source's regions registered until the reader's notification arrives; send
    back what it said and whether the regions are untouched."""
    regions = {key: np.frombuffer(bytearray(value), dtype=np.uint8)
               for key, value in source.items()}
    side = endpoint("prefill-pull", region_addresses(regions))
    pipe.send((side.metadata, region_addresses(regions)))
    deadline = time.monotonic() + 30
    notes: list[bytes] = []
    while not notes and time.monotonic() < deadline:
        for messages in side.agent.get_new_notifs().values():
            notes.extend(messages)
        time.sleep(0.005)
    untouched = all(regions[key].tobytes() == value for key, value in source.items())
    pipe.send((notes, untouched))


def test_the_destination_reads_and_the_source_is_notified() -> None:
    from hisparse_plan.exchange.transfer.executors import nixl_prepared

    src = Instance([deepseek_plan(hisparse=False, layers=2)])
    dst = Instance([deepseek_plan(hisparse=True, layers=2)])
    pattern = compile_transfer(src, dst)
    check_pattern(pattern, src, dst)
    request = TransferRequest(num_tokens=300, source_blocks=request_blocks(src, 300, 1),
                              destination_blocks=request_blocks(dst, 300, 2))
    made = pattern.instantiate(request)
    source, _, expected, allowed = oracle(src, dst, request, made.program())
    destination = buffers(pattern.destination, fill=None, seed=2)
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    child = context.Process(target=source_process,
                            args=({k: v.tobytes() for k, v in source.items()}, theirs))
    child.start()
    try:
        metadata, remote = ours.recv()
        side = endpoint("decode-pull", region_addresses(destination))
        prepared = nixl_prepared.prepare(side, metadata, pattern, remote,
                                         initiator="destination")
        assert prepared.initiator == "destination"
        handle: Any = nixl_prepared.make(side, prepared, made, notification=b"req-7")
        run_to_done(side, handle, timeout_s=30)
        notes, untouched = ours.recv()
    finally:
        child.join(timeout=30)
        if child.is_alive():
            child.terminate()
    assert notes == [b"req-7"]
    assert untouched
    assert wrong_bytes(destination, expected, allowed) == 0
    # The request's bytes really moved: the destination differs from how it started.
    start = buffers(pattern.destination, fill=None, seed=2)
    assert any((destination[key] != start[key]).any() for key in start)


def test_an_unknown_initiator_is_refused() -> None:
    from hisparse_plan.exchange.transfer.errors import TransferCheckError
    from hisparse_plan.exchange.transfer.executors import nixl_prepared

    src = Instance([deepseek_plan(hisparse=False, layers=2)])
    pattern = compile_transfer(src, src)
    with pytest.raises(TransferCheckError, match="initiator"):
        nixl_prepared.prepare(None, b"", pattern, {}, initiator="decode")  # type: ignore[arg-type]
