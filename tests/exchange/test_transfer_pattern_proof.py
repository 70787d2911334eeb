"""check_pattern proves every request the plans admit, not the requests a probe picks: rows
of units no probe selects (windows shorter than a period) and rows pinned to one block of a
small pool are refused; each such edit is first shown to move wrong bytes for some request
(the transfer oracle's arithmetic, instantiate bypassing the proof). Patterns and staged
patterns survive their own JSON; only the PlanError family leaves the checks, instantiate
and the executors. The proof's size depends on the pattern, not on the pools."""

from __future__ import annotations

import pytest

from hisparse_plan.exchange.transfer import (
    Instance,
    TransferCheckError,
    TransferRefused,
    TransferRequest,
    build_transfer,
    check_pattern,
    check_staged,
    check_transfer,
    compile_staged,
    compile_transfer,
)
from hisparse_plan.exchange.transfer.executors.reference import execute
from hisparse_plan.exchange.transfer.pattern.parts import PatternRow
from hisparse_plan.exchange.transfer.pattern.staging import StagedPattern
from hisparse_plan.exchange.transfer.pattern.transfer_pattern import TransferPattern
from hisparse_plan.exchange.transfer.program.transfer_program import TransferProgram
from support.pattern_edit_fuzz import _firsts
from support.pattern_edit_seeds import (
    SeedPair,
    llama_small_pool,
    sglang_window,
    shared_small_pool,
)
from support.transfer_support import (
    attention_layers,
    oracle,
    request_blocks,
    vllm_plan,
    wrong_bytes,
)


def _request(pair: SeedPair, tokens: int, seed: int = 0) -> TransferRequest:
    return TransferRequest(num_tokens=tokens,
                           source_blocks=request_blocks(pair.source, tokens, seed),
                           destination_blocks=request_blocks(pair.destination, tokens,
                                                             seed + 1))


def _wrong(pair: SeedPair, pattern: TransferPattern, request: TransferRequest) -> int:
    """Bytes the pattern's rows for `request` leave wrong (the oracle's own arithmetic)."""
    firsts, reach = _firsts(pair, request.num_tokens)
    source, destination, expected, allowed = oracle(pair.source, pair.destination, request,
                                                    pattern, firsts, reach)
    execute(pattern.instantiate(request).program(), source, destination)
    return wrong_bytes(destination, expected, allowed)


def _with_row(pattern: TransferPattern, index: int, **update: int) -> TransferPattern:
    rows: list[PatternRow] = list(pattern.rows)
    rows[index] = rows[index].model_copy(update=update)
    return pattern.model_copy(update={"rows": rows})


def test_rows_of_units_no_probe_selects_are_proved() -> None:
    """SGLang page 64 -> page 16 with a 40-token window: the window link's period is 64
    tokens, and a request of one period (or of any multiple) selects its last 48 units only;
    requests of other lengths select the first block's row too. Writing that row one block
    on moves bytes into a block the request was not given."""
    pair = sglang_window()
    pattern = compile_transfer(pair.source, pair.destination)
    window = next(i for i, link in enumerate(pattern.links) if link.window == 40)
    rows = [i for i, row in enumerate(pattern.rows) if row.link == window]
    assert {pattern.rows[i].dst_slot for i in rows} == {0, 1, 2, 3}
    for index in rows:
        row = pattern.rows[index]
        edited = _with_row(pattern, index, dst_offset=row.dst_offset + row.dst_block_stride)
        if row.dst_slot == 0:
            # The edit is harmful: 50 tokens select the window's first destination block.
            assert _wrong(pair, edited, _request(pair, 50)) > 0
        with pytest.raises(TransferCheckError):
            check_pattern(edited, pair.source, pair.destination)


def test_a_row_pinned_to_one_block_of_a_small_pool_is_refused() -> None:
    """Llama-3-8B block 16 -> 64, 8-block pools (7 ids a request may get): a row with block
    stride 0 and its offset at block k moves the right bytes only when the request's id at
    its position is k. Probes of the lowest and highest ids, 112 tokens each, give the
    source's fourth position id 4 both times; every k is refused, on both sides."""
    pair = llama_small_pool()
    pattern = compile_transfer(pair.source, pair.destination)
    assert [t.num_blocks for t in (*pattern.source_tables, *pattern.destination_tables)] \
        == [8, 8]
    for index, row in enumerate(pattern.rows):
        for side in ("src", "dst"):
            offset, stride = getattr(row, f"{side}_offset"), getattr(row, f"{side}_block_stride")
            for block in range(8):
                edited = _with_row(pattern, index, **{f"{side}_block_stride": 0,
                                                      f"{side}_offset": offset + block * stride})
                with pytest.raises(TransferCheckError):
                    check_pattern(edited, pair.source, pair.destination)
    # The edit is harmful: the source row of the fourth block pinned at block 4 reads
    # another block for a request whose fourth source id is not 4.
    index = next(i for i, row in enumerate(pattern.rows) if row.src_slot == 3)
    row = pattern.rows[index]
    edited = _with_row(pattern, index, src_block_stride=0,
                       src_offset=row.src_offset + 4 * row.src_block_stride)
    request = _request(pair, 112, seed=3)
    assert request.source_blocks["group.0"][3] != 4
    assert _wrong(pair, edited, request) > 0


def test_the_proof_does_not_grow_with_the_pools() -> None:
    """One pattern of one pair, pools of 24 and of 2,400 blocks: the same proof."""
    layers = attention_layers(2, 2, window=40) | attention_layers(1, 2, first=2)
    proofs = []
    for blocks in (40, 4000):
        src = Instance([vllm_plan(layers, layout="BLNHC", blocks=blocks, max_model_len=128)])
        dst = Instance([vllm_plan({k: v | {"block_size": 64} for k, v in layers.items()},
                                  layout="LBHNC", blocks=blocks // 4, max_model_len=128)])
        pattern = compile_transfer(src, dst)
        proof = check_pattern(pattern, src, dst)
        proofs.append((proof.rows, proof.links, proof.token_counts, proof.boxes))
    assert proofs[0] == proofs[1]


def test_patterns_of_tables_sharing_a_pool_survive_their_json() -> None:
    pair = shared_small_pool()
    pattern = compile_transfer(pair.source, pair.destination)
    assert pattern.shared
    staged = compile_staged(pattern, 2)
    again = TransferPattern.model_validate_json(pattern.model_dump_json())
    assert again == pattern
    assert StagedPattern.model_validate_json(staged.model_dump_json()) == staged
    check_staged(StagedPattern.model_validate_json(staged.model_dump_json()), pair.source,
                 pair.destination)
    request = _request(pair, 100)
    program = again.instantiate(request).program()
    assert TransferProgram.model_validate_json(program.model_dump_json()) == program
    assert TransferRequest.model_validate_json(request.model_dump_json()) == request
    # A pattern a request has instantiated still compares by its fields.
    pattern.instantiate(request)
    assert again == pattern


@pytest.mark.parametrize("field", ["src_rank", "dst_rank"])
def test_a_rank_past_the_instance_is_refused(field: str) -> None:
    pair = shared_small_pool()
    pattern = compile_transfer(pair.source, pair.destination)
    staged = compile_staged(pattern, 2)
    for index in range(len(pattern.rows)):
        edited = _with_row(pattern, index, **{field: 1})
        with pytest.raises(TransferCheckError, match="rank 1 does not exist"):
            check_pattern(edited, pair.source, pair.destination)
        with pytest.raises(TransferCheckError):
            check_staged(staged.model_copy(update={"pattern": edited}), pair.source,
                         pair.destination)
    program = build_transfer(pair.source, pair.destination, _request(pair, 100))
    row = program.rows[0].model_copy(update={field: 1})
    with pytest.raises(TransferCheckError):
        check_transfer(program.model_copy(update={"rows": [row, *program.rows[1:]]}),
                       pair.source, pair.destination)
    # The ranks' listed regions naming another rank.
    side = "source" if field == "src_rank" else "destination"
    ranks = [getattr(program, side)[0].model_copy(update={"rank": 1})]
    with pytest.raises(TransferCheckError, match="rank"):
        check_transfer(program.model_copy(update={side: ranks}), pair.source,
                       pair.destination)
    with pytest.raises(TransferCheckError, match="rank"):
        check_pattern(pattern.model_copy(update={side: ranks}), pair.source,
                      pair.destination)


def test_num_tokens_is_bounded_by_the_ids_before_any_array_is_sized() -> None:
    pair = llama_small_pool()
    pattern = compile_transfer(pair.source, pair.destination)
    few = _request(pair, 112)
    huge = few.model_copy(update={"num_tokens": 2**40})
    with pytest.raises(TransferRefused, match="needs"):
        pattern.instantiate(huge)
    with pytest.raises(TransferRefused):
        compile_staged(pattern, 2).instantiate(huge)


def test_the_reference_executor_refuses_a_region_it_has_no_buffer_for() -> None:
    pair = shared_small_pool()
    program = build_transfer(pair.source, pair.destination, _request(pair, 100))
    row = program.rows[0].model_copy(update={"dst_region": "nonesuch"})
    edited = program.model_copy(update={"rows": [row]})
    with pytest.raises(TransferCheckError, match="no buffer"):
        execute(edited, {}, {})


def test_a_staging_region_is_exactly_what_its_areas_take() -> None:
    """An executor allocates `staging_bytes`: one byte more or less than the areas take is
    refused (more would let a staged pattern ask for any amount of memory)."""
    pair = shared_small_pool()
    staged = compile_staged(compile_transfer(pair.source, pair.destination), 2)
    check_staged(staged, pair.source, pair.destination)
    for change in (1, -1, 2**40):
        sizes = [size + change for size in staged.staging_bytes]
        with pytest.raises(TransferCheckError, match="staging"):
            check_staged(staged.model_copy(update={"staging_bytes": sizes}), pair.source,
                         pair.destination)
