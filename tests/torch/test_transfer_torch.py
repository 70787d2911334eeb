"""The torch executor (hisparse_plan.torch.transfer) on CPU tensors: it writes exactly what the
reference executor writes, into pools `allocate` made for the destination plan as well as
into plain tensors, and refuses regions it cannot post into."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from hisparse_plan.exchange.transfer import (
    Instance,
    TransferCheckError,
    TransferRequest,
    build_transfer,
    check_staged,
    compile_staged,
    compile_transfer,
)
from hisparse_plan.exchange.transfer.executors.reference import Buffers, buffers
from hisparse_plan.exchange.transfer.executors.reference import execute as reference_execute
from hisparse_plan.torch import allocate, transfer_regions
from hisparse_plan.torch.transfer import execute, execute_request, rearrange_round, stage_round
from support.transfer_support import deepseek_plan, oracle, request_blocks, wrong_bytes


def tensors(regions: Buffers) -> dict[tuple[int, str], torch.Tensor]:
    return {key: torch.from_numpy(value.copy()) for key, value in regions.items()}


def pair(source: Any, destination: Any, tokens: int) -> tuple[Instance, Instance, Any]:
    # Every plan here is DeepSeek-V3.2's e4m3 cache (SGLang's plan does not name its fp8).
    src = Instance([source], cache_dtype="fp8_e4m3")
    dst = Instance([destination], cache_dtype="fp8_e4m3")
    request = TransferRequest(num_tokens=tokens, source_blocks=request_blocks(src, tokens, 1),
                              destination_blocks=request_blocks(dst, tokens, 2))
    return src, dst, build_transfer(src, dst, request)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_torch_writes_what_the_reference_writes(engine: str) -> None:
    src, dst, program = pair(deepseek_plan(hisparse=False, layers=2),
                             deepseek_plan(hisparse=True, engine=engine, layers=2), 300)
    source, destination, expected, allowed = oracle(src, dst, program.request, program)
    theirs = {key: value.copy() for key, value in destination.items()}
    reference_execute(program, source, theirs)
    ours = tensors(destination)
    assert execute(program, tensors(source), ours) == program.bytes
    after = {key: value.numpy() for key, value in ours.items()}
    assert all(np.array_equal(after[key], theirs[key]) for key in theirs)
    assert wrong_bytes(after, expected, allowed) == 0
    assert sum(int(np.count_nonzero(after[key] != destination[key])) for key in after) > 0


def test_torch_posts_into_pools_allocate_made() -> None:
    src, dst, program = pair(deepseek_plan(hisparse=False, layers=2),
                             deepseek_plan(hisparse=True, layers=2), 200)
    source, _, expected, allowed = oracle(src, dst, program.request, program)
    written = buffers(program.destination, fill=0)
    reference_execute(program, source, written)
    with allocate(dst.plans[0], device="cpu", pin=False) as pools:
        regions = transfer_regions(pools, program.destination[0])
        assert sorted(regions) == sorted(written)
        for tensor in regions.values():
            tensor.zero_()
        execute(program, tensors(source), regions)
        after = {key: value.reshape(-1).view(torch.uint8)[:written[key].size].numpy().copy()
                 for key, value in regions.items()}
    assert all(np.array_equal(after[key], written[key]) for key in written)
    # What it wrote is what the destination's views place there (or, past the last token, may).
    assert sum(int(np.count_nonzero((after[key] != expected[key]) & (after[key] != 0)
                                    & (after[key] != allowed[key]))) for key in after) == 0


def test_torch_refuses_a_missing_or_short_region() -> None:
    *_, program = pair(deepseek_plan(hisparse=False, layers=2),
                       deepseek_plan(hisparse=False, layers=2), 100)
    source = tensors(buffers(program.source))
    destination = tensors(buffers(program.destination))
    (key,) = destination
    with pytest.raises(TransferCheckError, match="no tensor given"):
        execute(program, source, {})
    with pytest.raises(TransferCheckError, match=f"expected {destination[key].numel()} bytes"):
        execute(program, source, {key: destination[key][:-1]})
    with pytest.raises(TransferCheckError, match="expected a contiguous tensor"):
        execute(program, source, {key: destination[key].reshape(2, -1).t()})


@pytest.mark.parametrize(("engine", "tokens"), [("vllm", 300), ("sglang", 300), ("vllm", 1)])
def test_torch_posts_an_instantiated_request_batched_by_block(engine: str, tokens: int) -> None:
    src, dst, program = pair(deepseek_plan(hisparse=False, layers=2),
                             deepseek_plan(hisparse=True, engine=engine, layers=2), tokens)
    made = compile_transfer(src, dst).instantiate(program.request)
    source, destination, expected, allowed = oracle(src, dst, program.request, program)
    theirs = {key: value.copy() for key, value in destination.items()}
    reference_execute(made.program(), source, theirs)
    ours = tensors(destination)
    assert execute_request(made, tensors(source), ours) == made.bytes == made.program().bytes
    after = {key: value.numpy() for key, value in ours.items()}
    assert all(np.array_equal(after[key], theirs[key]) for key in theirs)
    assert wrong_bytes(after, expected, allowed) == 0


@pytest.mark.parametrize(("engine", "tokens", "slots"), [("vllm", 300, 2), ("sglang", 700, 16)])
def test_torch_stages_and_rearranges_a_request(engine: str, tokens: int, slots: int) -> None:
    """Both phases with torch, round by round, write what the pattern's rows write."""
    src, dst, program = pair(deepseek_plan(hisparse=False, layers=2),
                             deepseek_plan(hisparse=True, engine=engine, layers=2), tokens)
    staged = compile_staged(compile_transfer(src, dst), slots)
    check_staged(staged, src, dst)
    made = staged.instantiate(program.request)
    source, destination, expected, allowed = oracle(src, dst, program.request, program)
    sent, ours = tensors(source), tensors(destination)
    staging = tensors(buffers(made.staging_regions()))
    written = 0
    for round_ in made.rounds:
        stage_round(made, round_, sent, staging)
        written += rearrange_round(made, round_, staging, ours)
    assert written == made.bytes
    after = {key: value.numpy() for key, value in ours.items()}
    assert wrong_bytes(after, expected, allowed) == 0
