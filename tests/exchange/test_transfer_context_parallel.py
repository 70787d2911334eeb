"""Decode context parallelism (docs/transfer.md#decode-context-parallelism): a prefill moved
into a vLLM decode whose DCP ranks each hold a strided set of the request's tokens.

The oracle's arithmetic is its own: vLLM 0.34's slot mapping written out as the kernel does
it (`_compute_slot_mappings_kernel`, `vllm/v1/worker/gpu/block_table.py`: a virtual block of
`block_size * dcp` tokens, the rank `offset // interleave % dcp`, its local offset
`offset // (interleave * dcp) * interleave + offset % interleave`), over every token of the
request, then each byte read back through the decode plan's own views
(transfer_support.rank_cells). The reference executor moves real bytes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from hisparse_plan.exchange.transfer import (
    Instance,
    TransferCheckError,
    TransferRefused,
    TransferRequest,
    build_transfer,
    check_pattern,
    check_transfer,
    compile_transfer,
)
from hisparse_plan.exchange.transfer.executors.reference import buffers, execute
from hisparse_plan.exchange.transfer.program.transfer_program import TransferProgram
from support.dcp_oracle import expected_after, slot_of
from support.transfer_support import (
    attention_layers,
    layer_shapes,
    plan_of,
    request_blocks,
    sglang_plan,
    vllm_plan,
    write,
    wrong_bytes,
)

# ---- the oracle (support.dcp_oracle: vLLM's slot mapping written out) ----------------------

def wrong(src: Instance, dst: Instance, request: TransferRequest, program: TransferProgram,
          dcp: int, interleave: int) -> int:
    """Bytes of the decode that are neither what it must hold nor (past the request's last
    token, inside blocks both sides give) what it may hold, after the reference executor."""
    theirs = layer_shapes(dst)
    ids = {name: number for number, name in enumerate(sorted(theirs))}
    source = buffers(program.source, fill=None, seed=1)
    write(src, dict(request.source_blocks), source, ids, {n: (0, 2**40) for n in theirs})
    destination = buffers(program.destination, fill=None, seed=2)
    expected, allowed = expected_after(src, dst, request, destination, dcp, interleave)
    execute(program, source, destination)
    return wrong_bytes(destination, expected, allowed)


# ---- plans ---------------------------------------------------------------------------------

def dcp_decode(dcp: int, tp: int, interleave: int, *, heads: int = 2, block: int = 16,
               layout: str = "LBNHC") -> Instance:
    """A vLLM decode of `tp` ranks, DCP `dcp`: `heads` KV heads, each on tp / heads ranks."""
    plan = vllm_plan(attention_layers(2, max(1, heads // tp), block=block), layout=layout,
                     decode_context_parallel_size=dcp, max_num_batched_tokens=256)
    return Instance([plan] * tp, total_kv_heads=heads, cp_kv_cache_interleave_size=interleave)


def prefill(tp: int, *, heads: int = 2, block: int = 16, layout: str = "BLNHC") -> Instance:
    plan = vllm_plan(attention_layers(2, heads // tp, block=block), layout=layout)
    return Instance([plan] * tp, total_kv_heads=heads)


def deepseek(dcp: int, interleave: int = 1) -> Instance:
    """DeepSeek-V3.2's first two layers (latent rows, index-key pages), block 64, BLNHC;
    `dcp` TP ranks all in one DCP group when dcp > 1."""
    from hisparse_plan.models import KVCacheLayout
    from hisparse_plan.presets import Settings, build_request, load_preset

    request = build_request(load_preset("deepseek-v3.2").architecture, Settings(
        max_model_len=1024, layout=KVCacheLayout.BLNHC, block_size=64, kv_dtype="fp8_ds_mla",
        hisparse=False))
    data: dict[str, Any] = request.model_dump(mode="json")
    data["layers"] = {name: spec for name, spec in data["layers"].items()
                      if name.startswith(("model.layers.0.", "model.layers.1."))}
    data["device"].update(num_blocks_override=24, available_bytes=2**40)
    data["scheduler"]["decode_context_parallel_size"] = dcp
    return Instance([plan_of(data)] * dcp, cp_kv_cache_interleave_size=interleave)


def request_for(src: Instance, dst: Instance, tokens: int, seed: int) -> TransferRequest:
    return TransferRequest(num_tokens=tokens, source_blocks=request_blocks(src, tokens, seed),
                           destination_blocks=request_blocks(dst, tokens, seed + 1))


Maker = Callable[[], Instance]
PAIRS: dict[str, tuple[Maker, Maker, int, int]] = {
    # name: (prefill, decode, dcp, interleave)
    "tp1 -> tp4 dcp2, interleave 1": (lambda: prefill(1), lambda: dcp_decode(2, 4, 1), 2, 1),
    "tp1 -> tp4 dcp2, interleave 4": (lambda: prefill(1), lambda: dcp_decode(2, 4, 4), 2, 4),
    "tp1 -> tp4 dcp2, interleave = block (NIXL's)": (
        lambda: prefill(1), lambda: dcp_decode(2, 4, 16), 2, 16),
    "tp1 block 16 -> tp4 dcp4 block 32 BLHNC, one head": (
        lambda: prefill(1, heads=1), lambda: dcp_decode(4, 4, 1, heads=1, block=32,
                                                       layout="BLHNC"), 4, 1),
    "tp2 LBHNC block 32 -> tp4 dcp2 block 16, interleave 8": (
        lambda: prefill(2, block=32, layout="LBHNC"), lambda: dcp_decode(2, 4, 8), 2, 8),
    "deepseek-v3.2 dense -> dcp2, interleave = block": (
        lambda: deepseek(1), lambda: deepseek(2, 64), 2, 64),
}


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_programs_and_patterns_land_every_token_on_its_dcp_rank(name: str) -> None:
    make_src, make_dst, dcp, interleave = PAIRS[name]
    src, dst = make_src(), make_dst()
    pattern = compile_transfer(src, dst)
    check_pattern(pattern, src, dst)
    for seed, tokens in enumerate((1, 7, 40, 97, 130)):
        request = request_for(src, dst, tokens, seed)
        program = build_transfer(src, dst, request)
        check_transfer(program, src, dst)
        assert wrong(src, dst, request, program, dcp, interleave) == 0, (name, tokens)
        made = pattern.instantiate(request).program()
        check_transfer(made, src, dst)
        assert wrong(src, dst, request, made, dcp, interleave) == 0, (name, tokens)


def test_the_oracle_sees_a_token_on_the_wrong_rank() -> None:
    # The same program judged as if the decode had another interleave: bytes land wrong.
    src, dst = prefill(1), dcp_decode(2, 4, 1)
    request = request_for(src, dst, 40, 3)
    program = build_transfer(src, dst, request)
    assert wrong(src, dst, request, program, 2, 2) > 0


def test_the_decode_holds_each_token_once_over_its_dcp_group() -> None:
    # Independent of the transfer: the kernel's positions over one DCP group are a bijection.
    for dcp, interleave, block in ((2, 1, 16), (4, 2, 16), (2, 16, 16), (8, 1, 64)):
        seen = {}
        for token in range(5 * block * dcp):
            owners = [(rank, slot) for rank in range(dcp)
                      if (slot := slot_of(token, block, dcp, interleave, rank)) is not None]
            assert len(owners) == 1
            assert owners[0] not in seen
            seen[owners[0]] = token


def test_the_proof_refuses_a_row_sent_to_the_other_dcp_rank() -> None:
    src, dst = prefill(1), dcp_decode(2, 4, 1)
    request = request_for(src, dst, 40, 4)
    program = build_transfer(src, dst, request)
    rows = list(program.rows)
    rows[0] = rows[0].model_copy(update={"dst_rank": rows[0].dst_rank ^ 1})
    with pytest.raises(TransferCheckError, match=r"DCP rank|write|needs"):
        check_transfer(program.model_copy(update={"rows": rows}), src, dst)


def test_the_proof_refuses_a_program_that_misses_a_dcp_rank() -> None:
    src, dst = prefill(1), dcp_decode(2, 4, 1)
    request = request_for(src, dst, 40, 5)
    program = build_transfer(src, dst, request)
    rows = [row for row in program.rows if row.dst_rank != 1]
    with pytest.raises(TransferCheckError, match="destination rank 1"):
        check_transfer(program.model_copy(update={"rows": rows}), src, dst)


def test_the_pattern_period_holds_the_dcp_group() -> None:
    src, dst = prefill(1), dcp_decode(2, 4, 1)
    (link,) = compile_transfer(src, dst).links
    assert (link.source_units, link.destination_units, link.period) == (16, 32, 32)
    assert dst.tables["group.0"].block_tokens == 32  # a request's block: 16 tokens x dcp 2


def refusal(src: Instance, dst: Instance) -> TransferRefused:
    with pytest.raises(TransferRefused) as caught:
        compile_transfer(src, dst)
    with pytest.raises(TransferRefused):
        build_transfer(src, dst, TransferRequest(num_tokens=1, source_blocks={},
                                                 destination_blocks={}))
    return caught.value


def test_a_dcp_source_is_refused_naming_it() -> None:
    error = refusal(dcp_decode(2, 4, 1), dcp_decode(2, 4, 1))
    assert (error.what, error.source) == ("decode_context_parallel_size", 2)
    assert error.field == "source.plans[0].workload.decode_context_parallel_size"


def test_index_pages_need_an_interleave_of_whole_pages() -> None:
    error = refusal(deepseek(1), deepseek(2, 1))
    assert (error.what, error.destination) == ("cp_kv_cache_interleave_size", 1)
    assert error.layer is not None
    assert "indexer" in error.layer


def test_an_interleave_that_does_not_divide_the_block_is_refused() -> None:
    error = refusal(prefill(1), dcp_decode(2, 4, 3))
    assert (error.what, error.field) == ("cp_kv_cache_interleave_size",
                                         "cp_kv_cache_interleave_size")


def test_ranks_that_do_not_form_dcp_groups_are_refused() -> None:
    plan = vllm_plan(attention_layers(2, 1), decode_context_parallel_size=2,
                     max_num_batched_tokens=256)
    error = refusal(prefill(1), Instance([plan] * 3, total_kv_heads=2))
    assert (error.what, error.field) == ("decode_context_parallel_size", "plans")


def test_an_sglang_dcp_decode_is_refused_naming_it() -> None:
    from hisparse_plan.models.sglang_plan import SGLangPlan

    ours = sglang_plan(attention_layers(1, 2), page=16)
    assert isinstance(ours, SGLangPlan)
    theirs = ours.model_copy(update={"budget": ours.budget.model_copy(update={"dcp_size": 2})})
    error = refusal(Instance([ours]), Instance([theirs]))
    assert (error.what, error.destination) == ("decode_context_parallel_size", 2)
    assert error.field == "destination.plans[0].budget.dcp_size"


def test_an_interleave_below_one_is_refused() -> None:
    from hisparse_plan.errors import PlanError

    with pytest.raises(PlanError, match="cp_kv_cache_interleave_size"):
        Instance([vllm_plan(attention_layers(1, 2))], cp_kv_cache_interleave_size=0)


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_staged_patterns_into_a_dcp_decode_are_proved(name: str) -> None:
    from hisparse_plan.exchange.transfer import check_staged, compile_staged

    make_src, make_dst, _, _ = PAIRS[name]
    src, dst = make_src(), make_dst()
    proof = check_staged(compile_staged(compile_transfer(src, dst), 4), src, dst)
    assert proof.slabs > 0
