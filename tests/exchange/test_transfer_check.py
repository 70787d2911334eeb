"""check_transfer proves programs from the plans alone: it accepts what build_transfer makes
and refuses edited programs (an overlap, a row out of its region, the wrong heads, a dropped
row, a block that is not the request's, a HiSparse copy written, a chunk too many)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from hisparse_plan.exchange.transfer import (
    Instance,
    TransferCheckError,
    TransferProgram,
    TransferRequest,
    TransferRow,
    build_transfer,
    check_transfer,
)
from support.transfer_support import (
    attention_layers,
    deepseek_plan,
    request_blocks,
    sglang_plan,
    vllm_plan,
)


def tp(ranks: int, total: int, make: Any) -> Instance:
    return Instance([make(max(1, total // ranks)) for _ in range(ranks)], total_kv_heads=total)


def program_for(src: Instance, dst: Instance, tokens: int, seed: int = 0,
                runs: bool = True) -> tuple[TransferProgram, Instance, Instance]:
    request = TransferRequest(num_tokens=tokens,
                              source_blocks=request_blocks(src, tokens, seed, runs=runs),
                              destination_blocks=request_blocks(dst, tokens, seed + 1,
                                                                runs=runs))
    return build_transfer(src, dst, request), src, dst


def gqa_4_to_2() -> tuple[TransferProgram, Instance, Instance]:
    src = tp(4, 8, lambda h: vllm_plan(attention_layers(2, h), layout="BLNHC"))
    dst = tp(2, 8, lambda h: vllm_plan(attention_layers(2, h), layout="LBHNC"))
    return program_for(src, dst, 100)


def edited(program: TransferProgram, rows: list[TransferRow]) -> TransferProgram:
    return program.model_copy(update={"rows": rows})


def refuses(program: TransferProgram, src: Instance, dst: Instance, match: str) -> None:
    with pytest.raises(TransferCheckError, match=match):
        check_transfer(program, src, dst)


Case = Callable[[], tuple[TransferProgram, Instance, Instance]]
CASES: dict[str, Case] = {
    "gqa tp 4 -> 2, block- to layer-outermost": gqa_4_to_2,
    "gqa tp 2 -> 4 into SGLang": lambda: program_for(
        tp(2, 4, lambda h: vllm_plan(attention_layers(2, h), layout="BHLNC")),
        tp(4, 4, lambda h: sglang_plan(attention_layers(2, h), page=16)), 90),
    "mla vllm -> vllm hisparse": lambda: program_for(
        Instance([deepseek_plan(hisparse=False)]), Instance([deepseek_plan(hisparse=True)]),
        150),
    "mla sglang tp 2 -> vllm hisparse tp 4": lambda: program_for(
        Instance([deepseek_plan(engine="sglang")] * 2, cache_dtype="fp8_e4m3"),
        Instance([deepseek_plan(hisparse=True)] * 4), 150, runs=False),
}


@pytest.mark.parametrize("case", list(CASES))
def test_programs_build_transfer_makes_are_proved(case: str) -> None:
    program, src, dst = CASES[case]()
    proof = check_transfer(program, src, dst)
    assert proof.rows == len(program.rows)
    assert proof.bytes == program.bytes
    assert proof.layers == len(program.layers)


def test_a_row_written_twice_is_refused() -> None:
    program, src, dst = gqa_4_to_2()
    refuses(edited(program, [*program.rows, program.rows[0]]), src, dst, "both write")


def test_a_dropped_row_is_refused() -> None:
    program, src, dst = gqa_4_to_2()
    refuses(edited(program, program.rows[1:]), src, dst, r"write \d+ of the \d+ bytes")


def test_a_row_out_of_its_region_is_refused() -> None:
    program, src, dst = gqa_4_to_2()
    size = {r.name: r.size for r in program.destination[0].regions}["device"]
    first = program.rows[0].model_copy(update={"dst_offset": size - 1})
    refuses(edited(program, [first, *program.rows[1:]]), src, dst, "past region")


def test_the_wrong_head_interval_is_refused() -> None:
    # Source rank 0 holds heads 0-1, rank 1 heads 2-3: a row read from the other rank puts
    # its heads where the destination keeps another pair.
    program, src, dst = gqa_4_to_2()
    index, first = next((i, r) for i, r in enumerate(program.rows) if r.src_rank in (0, 1))
    wrong = first.model_copy(update={"src_rank": 1 - first.src_rank})
    rows = list(program.rows)
    rows[index] = wrong
    refuses(edited(program, rows), src, dst, "reads .* but writes where")


def test_a_block_that_is_not_the_requests_is_refused() -> None:
    program, src, dst = gqa_4_to_2()
    request = program.request
    blocks = request_blocks(dst, request.num_tokens, 7)
    other = program.model_copy(update={"request": request.model_copy(
        update={"destination_blocks": blocks})})
    refuses(other, src, dst, "not the request's|not consecutive blocks|writes")


def test_one_chunk_too_many_is_refused() -> None:
    program, src, dst = gqa_4_to_2()
    index, longest = max(enumerate(program.rows), key=lambda pair: pair[1].count)
    rows = list(program.rows)
    rows[index] = longest.model_copy(update={"count": longest.count + 1})
    refuses(edited(program, rows), src, dst, f"row {index}")


def test_writing_blocks_the_request_was_not_given_is_refused() -> None:
    # vLLM's HiSparse groups overlay the device pool's blocks: a block the request was not
    # given may hold another request's index keys, or resident and hot pages.
    program, src, dst = CASES["mla vllm -> vllm hisparse"]()
    row = next(r for r in program.rows if r.dst_region == "device" and r.count == 1)
    given = set(program.request.destination_blocks["group.1"])
    block = next(b for b in range(1, 100) if b not in given)
    indexer = dst.plans[0].tensors[1]
    moved = row.model_copy(update={"dst_offset": row.dst_offset % indexer.block_stride
                                   + block * indexer.block_stride})
    rows = [moved if r is row else r for r in program.rows]
    refuses(edited(program, rows), src, dst, "not the request's|not consecutive blocks")


def test_ranks_and_regions_must_exist() -> None:
    program, src, dst = gqa_4_to_2()
    first = program.rows[0]
    refuses(edited(program, [first.model_copy(update={"dst_rank": 5})]), src, dst,
            "rank 5 does not exist")
    refuses(edited(program, [first.model_copy(update={"src_region": "host"})]), src, dst,
            "no region 'host'")


def test_layer_names_in_rows_are_hints_only() -> None:
    program, src, dst = gqa_4_to_2()
    misnamed = [row.model_copy(update={"layer": "model.layers.1.self_attn.attn"})
                for row in program.rows]
    check_transfer(edited(program, misnamed), src, dst)


def test_the_proof_costs_boxes_per_row_not_per_token() -> None:
    # 2,000 tokens in one run of blocks on both sides: one box per layer, whatever the length.
    plan = vllm_plan(attention_layers(3, 2, block=16), layout="BLNHC", blocks=200,
                     max_model_len=2048)
    request = TransferRequest(num_tokens=2000,
                              source_blocks={"group.0": list(range(1, 126))},
                              destination_blocks={"group.0": list(range(70, 195))})
    program = build_transfer(plan, plan, request)
    proof = check_transfer(program, plan, plan)
    assert (len(program.rows), proof.boxes) == (1, 3)


def test_a_program_round_trips_through_json_and_is_proved_again() -> None:
    program, src, dst = gqa_4_to_2()
    again = TransferProgram.model_validate_json(program.model_dump_json())
    assert again == program
    check_transfer(again, src, dst)


def test_regions_the_plans_do_not_have_are_refused() -> None:
    program, src, dst = gqa_4_to_2()
    ranks = list(program.destination)
    region = ranks[0].regions[0]
    ranks[0] = ranks[0].model_copy(update={"regions": [
        region.model_copy(update={"size": region.size - 1})]})
    refuses(program.model_copy(update={"destination": ranks}), src, dst,
            "lists other regions than its plan")
