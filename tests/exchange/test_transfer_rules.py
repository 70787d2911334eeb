"""The transfer program's rules, each on its own (hisparse_plan.exchange.transfer): heads per
rank, the units a layer moves, unit groups over both sides' blocks, strided rows and their
coalescing, the refusals, and rows per run of blocks for each pool layout."""

from __future__ import annotations

from typing import Any

import pytest

from hisparse_plan.exchange.transfer import (
    Instance,
    TransferRefused,
    TransferRequest,
    build_transfer,
    check_transfer,
    tables,
)
from hisparse_plan.exchange.transfer.facts.heads import head_start, serving_ranks
from hisparse_plan.exchange.transfer.facts.rank_facts import LayerFacts
from hisparse_plan.exchange.transfer.program.coalesce import coalesce
from hisparse_plan.exchange.transfer.program.lower import Row, flatten
from hisparse_plan.exchange.transfer.program.units import (
    chunk_start,
    moved_tokens,
    unit_groups,
    window_start,
)
from support.transfer_support import (
    attention_layers,
    deepseek_plan,
    request_blocks,
    sglang_plan,
    vllm_plan,
)


def layer(*, heads: int = 2, replicated: bool = False, kind: str = "tokens") -> LayerFacts:
    return LayerFacts("l", "t", kind, 16, 1, heads, replicated, None, ())  # type: ignore[arg-type]


# ---- tensor parallelism --------------------------------------------------------------------

def test_heads_split_evenly_in_rank_order() -> None:
    assert [head_start(layer(heads=2), rank, 4, 8) for rank in range(4)] == [0, 2, 4, 6]


def test_fewer_heads_than_ranks_are_replicated_on_consecutive_ranks() -> None:
    assert [head_start(layer(heads=1), rank, 8, 2) for rank in range(8)] == [0] * 4 + [1] * 4


def test_replicated_rows_hold_every_head_and_a_state_is_its_ranks_shard() -> None:
    assert head_start(layer(heads=1, replicated=True), 3, 4, None) == 0
    assert head_start(layer(heads=1, kind="state"), 3, 4, None) == 3


@pytest.mark.parametrize(("heads", "ranks", "total"), [(2, 4, 6), (2, 8, 4), (1, 6, 4)])
def test_heads_that_do_not_split_are_refused(heads: int, ranks: int, total: int) -> None:
    with pytest.raises(TransferRefused, match=r"num_kv_heads|KV heads") as error:
        head_start(layer(heads=heads), 0, ranks, total)
    assert error.value.layer == "l"


def test_a_destination_rank_reads_its_heads_from_the_ranks_that_hold_them() -> None:
    # Source TP 4 (2 heads each) -> destination TP 2 (4 heads each): rank 1 needs heads 4..7.
    assert serving_ranks([0, 2, 4, 6], 2, (4, 8), 1) == [(2, 4, 6), (3, 6, 8)]
    # Source TP 2 -> destination TP 4: rank 3 needs heads 6..7, all on source rank 1.
    assert serving_ranks([0, 4], 4, (6, 8), 3) == [(1, 6, 8)]


def test_replicated_rows_spread_destination_ranks_over_source_ranks() -> None:
    starts = [0, 0, 0]
    assert [serving_ranks(starts, 1, (0, 1), rank)[0][0] for rank in range(6)] == \
        [0, 1, 2, 0, 1, 2]


# ---- units ---------------------------------------------------------------------------------

def test_moved_tokens_stop_at_the_shorter_last_block() -> None:
    assert moved_tokens(300, 64, 64) == 320
    assert moved_tokens(300, 64, 16) == 304
    assert moved_tokens(320, 64, 16) == 320


def test_window_and_chunk_layers_need_only_their_last_tokens() -> None:
    assert window_start(300, 64) == 236
    assert window_start(30, 64) == 0
    assert window_start(300, None) == 0
    assert chunk_start(300, 128) == 256
    assert chunk_start(256, 128) == 256


def test_equal_blocks_in_step_are_one_group() -> None:
    groups = unit_groups(0, 256, [5, 6, 7, 8], 64, [10, 11, 12, 13], 64)
    assert len(groups) == 1
    group = groups[0]
    assert (group.length, group.count, group.src_block, group.dst_block) == (64, 4, 5, 10)
    assert (group.src_block_step, group.dst_block_step) == (1, 1)


def test_a_break_in_either_sides_blocks_starts_a_group() -> None:
    groups = unit_groups(0, 256, [5, 6, 7, 8], 64, [10, 11, 3, 4], 64)
    assert [(g.unit, g.count, g.dst_block) for g in groups] == [(0, 2, 10), (128, 2, 3)]


def test_smaller_blocks_on_one_side_split_rows_at_the_common_granularity() -> None:
    groups = unit_groups(0, 128, [9, 4], 64, [20, 21, 22, 23, 30, 31, 32, 33], 16)
    # Each destination block (16 tokens) is one run; a source block's four runs step by 16
    # tokens inside it, so each source block is one group.
    assert [(g.unit, g.length, g.count, g.src_n_step, g.dst_block_step) for g in groups] == \
        [(0, 16, 4, 16, 1), (64, 16, 4, 16, 1)]


def test_a_partial_first_block_and_an_unaligned_stop() -> None:
    groups = unit_groups(10, 70, [1, 2], 64, [7, 8, 9, 10, 11], 16)
    covered = [(g.unit + j * g.length, g.length) for g in groups for j in range(g.count)]
    assert covered[0] == (10, 6)
    assert sum(length for _, length in covered) == 60
    assert covered[-1][0] + covered[-1][1] == 70


# ---- strided rows and coalescing -----------------------------------------------------------

def test_flatten_joins_axes_that_follow_on_both_sides_and_logically() -> None:
    # 4 tokens x 2 heads of 32 bytes, heads inner on both sides: one chunk of 256 bytes.
    chunk, extent, axes = flatten(32, (1, 1, 1, 32), [
        (4, 64, 64, (0, 1, 0, 0)), (2, 32, 32, (0, 0, 1, 0))])
    assert (chunk, extent, axes) == (256, (1, 4, 2, 32), [])


def test_flatten_keeps_axes_whose_logical_order_differs() -> None:
    # Heads inner on the source, tokens inner on the destination: no axis joins.
    chunk, _, axes = flatten(32, (1, 1, 1, 32), [
        (4, 64, 32, (0, 1, 0, 0)), (2, 32, 128, (0, 0, 1, 0))])
    assert chunk == 32
    assert sorted(axes) == [(2, 32, 128, (0, 0, 1, 0)), (4, 64, 32, (0, 1, 0, 0))]


def row(src: int, dst: int, start: tuple[int, int, int, int], length: int = 8) -> Row:
    return Row(0, "a", src, length, 1, 0, 0, "b", dst, 0, "l", start, (0, 0, 0, 0),
               (1, 1, 1, length), start[0])


def test_contiguous_rows_become_one_and_progressions_one_row_with_a_count() -> None:
    contiguous = coalesce([row(0, 100, (0, 0, 0, 0)), row(8, 108, (0, 0, 0, 8))])
    assert [(r.src_offset, r.length, r.chunks) for r in contiguous] == [(0, 16, 1)]
    stepped = coalesce([row(0, 100, (0, 0, 0, 0)), row(32, 200, (0, 1, 0, 0)),
                        row(64, 300, (0, 2, 0, 0))])
    assert [(r.chunks, r.src_stride, r.dst_stride) for r in stepped] == [(3, 32, 100)]


def test_rows_that_do_not_follow_logically_stay_apart() -> None:
    # The bytes progress, but the second row is another head of another token.
    rows = coalesce([row(0, 100, (0, 0, 0, 0)), row(32, 200, (0, 1, 1, 0))])
    assert len(rows) == 2


# ---- refusals ------------------------------------------------------------------------------

def refused(source: Any, destination: Any, tokens: int = 40) -> TransferRefused:
    src, dst = Instance([source]), Instance([destination])
    request = TransferRequest(num_tokens=tokens,
                              source_blocks=request_blocks(src, tokens, 1),
                              destination_blocks=request_blocks(dst, tokens, 2))
    with pytest.raises(TransferRefused) as error:
        build_transfer(src, dst, request)
    return error.value


def test_another_dtype_is_refused_naming_the_layer_field_and_both_values() -> None:
    error = refused(vllm_plan(attention_layers(2, 2)),
                    vllm_plan(attention_layers(2, 2, dtype="float16")))
    assert error.layer == "model.layers.0.self_attn.attn"
    assert (error.what, error.source, error.destination) == ("k.dtype", "bfloat16", "float16")
    assert "the source has bfloat16, the destination has float16" in str(error)


def test_another_row_size_is_refused() -> None:
    error = refused(vllm_plan(attention_layers(1, 2)),
                    vllm_plan(attention_layers(1, 2, head_size=32)))
    assert (error.what, error.source, error.destination) == ("k.bytes", 32, 64)


def test_a_layer_missing_on_one_side_is_refused() -> None:
    error = refused(vllm_plan(attention_layers(2, 2)), vllm_plan(attention_layers(1, 2)))
    assert (error.layer, error.what) == ("model.layers.1.self_attn.attn", "present")


def test_other_heads_of_the_model_are_refused() -> None:
    error = refused(vllm_plan(attention_layers(1, 2)), vllm_plan(attention_layers(1, 4)))
    assert (error.what, error.source, error.destination) == ("num_kv_heads (all ranks)", 2, 4)


def test_an_unknown_window_between_sglang_plans_is_refused() -> None:
    layers = attention_layers(1, 2, window=32) | attention_layers(1, 2, first=1)
    error = refused(sglang_plan(layers, page=16), sglang_plan(layers, page=1))
    assert error.what == "sliding_window"


def test_a_block_given_twice_or_past_the_pool_is_refused() -> None:
    plan = vllm_plan(attention_layers(1, 2), blocks=8, max_model_len=64)
    src = Instance([plan])
    for blocks, why in (([1, 1, 2], "twice"), ([1, 2, 8], "expected 1 <= block < 8"),
                        ([0, 1, 2], "expected 1 <= block"), ([1], "need 3 blocks")):
        request = TransferRequest(num_tokens=40, source_blocks={"group.0": blocks},
                                  destination_blocks={"group.0": [3, 4, 5]})
        with pytest.raises(TransferRefused, match=why):
            build_transfer(src, src, request)


def test_tables_name_each_engines_block_tables() -> None:
    assert list(tables(vllm_plan(attention_layers(1, 2)))) == ["group.0"]
    layers = attention_layers(1, 2, window=32) | attention_layers(1, 2, first=1)
    assert sorted(tables(sglang_plan(layers, page=16))) == ["full", "swa"]


# ---- rows per run of blocks, per layout ----------------------------------------------------

def descriptors(source: Any, destination: Any, src_blocks: list[int],
                dst_blocks: list[int], tokens: int) -> int:
    """Contiguous chunks the program posts (a row with a count is that many)."""
    request = TransferRequest(num_tokens=tokens, source_blocks={"group.0": src_blocks},
                              destination_blocks={"group.0": dst_blocks})
    program = build_transfer(source, destination, request)
    assert len(program.rows) <= program.descriptors
    return program.descriptors


@pytest.mark.parametrize("layout", ["BLNHC", "BLHNC", "BHLNC"])
def test_block_outermost_pools_of_one_layout_cost_one_chunk_per_run_of_blocks(layout: str
                                                                              ) -> None:
    plan = vllm_plan(attention_layers(3, 2, block=16), layout=layout)
    assert descriptors(plan, plan, [3, 4, 5, 6], [9, 10, 11, 12], 64) == 1
    # Two runs on the destination: two rows.
    assert descriptors(plan, plan, [3, 4, 5, 6], [9, 10, 17, 18], 64) == 2


@pytest.mark.parametrize("layout", ["LBNHC", "LBHNC"])
def test_layer_outermost_pools_cost_one_chunk_per_layer_per_run(layout: str) -> None:
    plan = vllm_plan(attention_layers(3, 2, block=16), layout=layout)
    assert descriptors(plan, plan, [3, 4, 5, 6], [9, 10, 11, 12], 64) == 3
    assert descriptors(plan, plan, [3, 4, 5, 6], [9, 10, 17, 18], 64) == 6


def test_a_row_counts_the_chunks_of_one_stride() -> None:
    # Layer-outermost on both sides, one run: each layer's pages are one chunk, one layer
    # stride apart on both sides: one row of three chunks.
    plan = vllm_plan(attention_layers(3, 2, block=16), layout="LBNHC")
    request = TransferRequest(num_tokens=64, source_blocks={"group.0": [3, 4, 5, 6]},
                              destination_blocks={"group.0": [9, 10, 11, 12]})
    (row,) = build_transfer(plan, plan, request).rows
    assert (row.count, row.length, row.src_stride) == (3, 4 * 2048, plan.tensors[0].layer_stride)


def test_block_outermost_to_layer_outermost_costs_one_row_per_layer_per_run() -> None:
    # A layer's pages are a block slab apart on the source: one chunk per page, one row per
    # layer stepping over the run.
    source = vllm_plan(attention_layers(3, 2, block=16), layout="BLNHC")
    destination = vllm_plan(attention_layers(3, 2, block=16), layout="LBNHC")
    request = TransferRequest(num_tokens=64, source_blocks={"group.0": [3, 4, 5, 6]},
                              destination_blocks={"group.0": [9, 10, 11, 12]})
    program = build_transfer(source, destination, request)
    assert (len(program.rows), program.descriptors) == (3, 12)
    assert {row.count for row in program.rows} == {4}


def test_a_decode_context_parallel_source_is_refused() -> None:
    # A DCP decode is moved into (tests/exchange/test_transfer_context_parallel.py); out of one,
    # not.
    layers = attention_layers(1, 2)
    error = refused(vllm_plan(layers, decode_context_parallel_size=2,
                              max_num_batched_tokens=256), vllm_plan(layers))
    assert (error.what, error.source) == ("decode_context_parallel_size", 2)


def test_a_window_layer_ignores_the_null_blocks_before_its_window() -> None:
    # vLLM gives a window layer's blocks outside the window back (null block 0 in the table).
    layers = attention_layers(1, 2, window=32) | attention_layers(1, 2, first=1)
    plan = vllm_plan(layers, layout="BLNHC", blocks=40)
    groups = tables(plan)
    window = next(key for key in groups if key != "group.1") if len(groups) > 1 else "group.0"
    request = TransferRequest(
        num_tokens=100,
        source_blocks={key: ([0, 0, 0, 0, 5, 6, 7] if key == window
                             else [9, 10, 11, 12, 13, 14, 30]) for key in groups},
        destination_blocks={key: ([0, 0, 0, 0, 15, 16, 17] if key == window
                                  else [19, 20, 21, 22, 23, 24, 31]) for key in groups})
    program = build_transfer(plan, plan, request)
    check_transfer(program, plan, plan)
    # The window layer moves tokens 68..111 (its last 32 and the rest of the last block).
    window_bytes = sum(row.bytes for row in program.rows
                       if row.layer == "model.layers.0.self_attn.attn")
    assert window_bytes == (112 - 68) * 2 * 64


@pytest.mark.parametrize("layout", ["BLNHC", "BLHNC"])
def test_a_slab_of_two_tensors_is_one_descriptor_per_run(layout: str) -> None:
    # DeepSeek-V3.2's block holds every layer's latent page, then every index-key page: two
    # tensors. Same layout on both sides: a run of blocks is one contiguous copy.
    plan = deepseek_plan(hisparse=False, layers=3, layout=layout, blocks=40)
    request = TransferRequest(num_tokens=256, source_blocks={"group.0": [3, 4, 5, 6]},
                              destination_blocks={"group.0": [9, 10, 11, 12]})
    program = build_transfer(plan, plan, request)
    assert (len(program.rows), program.descriptors) == (1, 1)
    check_transfer(program, plan, plan)
    split = request.model_copy(update={"destination_blocks": {"group.0": [9, 10, 20, 21]}})
    assert build_transfer(plan, plan, split).descriptors == 2
