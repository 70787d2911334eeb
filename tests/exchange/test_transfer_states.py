"""Mamba and linear-attention states between tensor-parallel sizes, and pipeline-parallel
instances (docs/transfer.md#states-across-tensor-parallel-sizes,
docs/transfer.md#pipeline-parallelism): programs and patterns proved, every byte read back
through the destination's views by the oracle's own arithmetic (each state byte encoded by
its place in the full state), edited programs refused, and what cannot move refused by
name."""

from __future__ import annotations

from typing import Any

import pytest

import hisparse_plan as hp
from hisparse_plan.exchange.transfer import (
    Instance,
    TransferCheckError,
    TransferProgram,
    TransferRefused,
    TransferRequest,
    build_transfer,
    check_pattern,
    check_transfer,
    compile_transfer,
)
from hisparse_plan.presets import Settings, build_request, load_preset
from hisparse_plan.presets.mamba_states import GatedDeltaNetGeometry
from hisparse_plan.presets.regular import RegularArchitecture
from support.transfer_support import (
    StateCuts,
    attention_layers,
    count_wrong,
    plan_of,
    request_blocks,
    roundtrip,
    sglang_request,
    sglang_stages,
    vllm_request,
    vllm_stages,
)

CONV, HEADS = (16, 8, 8), 4
"""The drawn conv state's channel blocks (x | B | C) and the temporal state's heads."""


def mamba_layers(tp: int, block: int = 16) -> dict[str, dict[str, Any]]:
    """Two Mamba-2-like layers (conv [3, 32 / tp] in vLLM's layout, temporal [4 / tp, 4, 8])
    beside an attention layer of 4 KV heads, one rank of `tp`."""
    state = {"kind": "mamba", "state_shapes": [[3, sum(CONV) // tp], [HEADS // tp, 4, 8]],
             "state_dtypes": ["bfloat16", "float32"], "block_size": block}
    return {f"model.layers.{i}.linear_attn": dict(state) for i in range(2)} | attention_layers(
        1, 4 // tp, block=block, first=2)


def mamba_side(engine: str, tp: int, groups: tuple[int, ...] | None = CONV) -> Instance:
    layers = mamba_layers(tp)
    if engine == "sglang":
        # SGLang's Mamba slots take what the budget leaves: a small one keeps them few.
        made = plan_of(sglang_request(layers, page_size=16, tokens=512, context_length=512,
                                      available=2**20))
    else:
        request = vllm_request(layers, layout="BLNHC", available=2**40, max_model_len=512)
        request["device"]["num_blocks_override"] = 48
        made = plan_of(request)
    return Instance([made] * tp, total_kv_heads=4, state_groups=groups)


def cuts(engine: str) -> StateCuts:
    """vLLM keeps the conv state (kernel - 1, channels), SGLang (channels, kernel - 1)."""
    return {0: (1 if engine == "vllm" else 0, CONV), 1: (0, (HEADS,))}


def request_for(src: Instance, dst: Instance, tokens: int = 70, seed: int = 0
                ) -> TransferRequest:
    return TransferRequest(num_tokens=tokens, source_blocks=request_blocks(src, tokens, seed),
                           destination_blocks=request_blocks(dst, tokens, seed + 1))


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize(("source_tp", "destination_tp"), [(1, 2), (2, 1), (2, 4), (4, 1)])
def test_states_move_between_tp_sizes(engine: str, source_tp: int, destination_tp: int
                                      ) -> None:
    src, dst = mamba_side(engine, source_tp), mamba_side(engine, destination_tp)
    request = request_for(src, dst)
    program, wrong = roundtrip(src, dst, request, states=cuts(engine))
    assert wrong == 0
    pattern = compile_transfer(src, dst)
    check_pattern(pattern, src, dst)
    assert count_wrong(src, dst, request, pattern.instantiate(request).program(),
                       states=cuts(engine)) == 0
    # Every destination rank's states come from each source rank whose shards overlap its.
    state_rows = {(row.src_rank, row.dst_rank) for row in program.rows
                  if row.layer.endswith("linear_attn")}
    ratio = max(source_tp, destination_tp) // min(source_tp, destination_tp)
    assert len(state_rows) == max(source_tp, destination_tp)
    assert all((s // ratio == d) if source_tp > destination_tp else (d // ratio == s)
               for s, d in state_rows)


def test_a_wrong_channel_block_split_moves_wrong_bytes_that_the_oracle_sees() -> None:
    """The oracle is not the library: one block where there are three puts every B and C
    channel of a rank in the wrong place."""
    src = mamba_side("vllm", 1, groups=(sum(CONV),))
    dst = mamba_side("vllm", 2, groups=None)
    _, wrong = roundtrip(src, dst, request_for(src, dst), states=cuts("vllm"))
    assert wrong > 0


def test_gated_deltanet_states_of_qwen3_next_between_tp_1_and_2() -> None:
    arch = load_preset("qwen3-next-80b").architecture
    assert isinstance(arch, RegularArchitecture)
    geometry = arch.state_geometry()
    assert isinstance(geometry, GatedDeltaNetGeometry)
    blocks = geometry.conv_blocks()
    assert blocks == (2048, 2048, 4096)

    def trimmed(tp: int) -> hp.KVCachePlan:
        request = build_request(arch, Settings(gpu_mem_bytes=2**26, max_model_len=1200, tp=tp))
        data = request.model_dump(mode="json")
        data["layers"] = {name: spec for name, spec in data["layers"].items()
                          if name.startswith("model.layers.0.")}
        return hp.plan(hp.PlanRequest.model_validate(data))

    src = Instance([trimmed(2)] * 2, state_groups=blocks)
    dst = Instance([trimmed(1)])
    program, wrong = roundtrip(src, dst, request_for(src, dst, 100),
                               states={0: (1, blocks), 1: (0, (32,))})
    assert wrong == 0
    # Per rank and row of the conv state (kernel - 1 = 3), one slice of q, k and v each;
    # the recurrent state is one slice per rank.
    assert len(program.rows) == 2 * (3 * 3 + 1)


def _edited(program: TransferProgram, index: int, **update: Any) -> TransferProgram:
    rows = list(program.rows)
    rows[index] = rows[index].model_copy(update=update)
    return program.model_copy(update={"rows": rows})


def test_edited_state_programs_are_refused() -> None:
    src, dst = mamba_side("vllm", 2), mamba_side("vllm", 1)
    request = request_for(src, dst)
    program = build_transfer(src, dst, request)
    check_transfer(program, src, dst)
    states = [i for i, row in enumerate(program.rows) if row.layer.endswith("linear_attn")]
    first = program.rows[states[0]]
    other = next(i for i in states if program.rows[i].src_offset != first.src_offset
                 and program.rows[i].length == first.length
                 and program.rows[i].src_rank == first.src_rank)
    edits = {
        # Another shard's bytes: the wrong head slice of the state.
        "wrong slice": _edited(program, states[0],
                               src_offset=program.rows[other].src_offset),
        "wrong source rank": _edited(program, states[0], src_rank=1 - first.src_rank),
        # The next block of the state table: another request's slot.
        "wrong slot": _edited(program, states[0], dst_offset=first.dst_offset + next(
            t.block_stride for t in dst.plans[0].tensors
            if t.layers[0].endswith("linear_attn"))),
        "dropped": program.model_copy(update={"rows": [
            row for i, row in enumerate(program.rows) if i != states[0]]}),
    }
    for name, edited in edits.items():
        with pytest.raises(TransferCheckError):
            check_transfer(edited, src, dst)
        assert name


@pytest.mark.parametrize("groups", [
    None,          # the conv state's blocks are not known
    (30, 1, 1),    # a block of one channel does not split over 2 ranks
    (16, 8),       # the blocks add up to another conv state
])
def test_states_across_tp_without_their_blocks_are_refused(groups: tuple[int, ...] | None
                                                           ) -> None:
    src, dst = mamba_side("vllm", 1, groups=groups), mamba_side("vllm", 2, groups=None)
    with pytest.raises(TransferRefused) as error:
        compile_transfer(src, dst)
    assert (error.value.what, error.value.field) == ("state_groups", "state_groups")
    assert "model.layers.0.linear_attn" in str(error.value)


def test_conflicting_state_groups_are_refused() -> None:
    src = mamba_side("vllm", 1, groups=CONV)
    dst = mamba_side("vllm", 2, groups=(8, 8, 16))
    with pytest.raises(TransferRefused) as error:
        compile_transfer(src, dst)
    assert error.value.what == "state_groups"


def test_a_state_padded_per_rank_is_refused() -> None:
    """Mamba-2 with fewer groups than ranks replicates the groups (vLLM's
    `extra_groups_for_head_shards`): the ranks' conv states are not shards of one state."""
    def side(tp: int, channels: int) -> Instance:
        state = {"kind": "mamba", "state_shapes": [[3, channels], [HEADS // tp, 4, 8]],
                 "state_dtypes": ["bfloat16", "float32"], "block_size": 16}
        request = vllm_request({"model.layers.0.mixer": state}, layout="BLNHC",
                               available=2**40, max_model_len=512)
        request["device"]["num_blocks_override"] = 48
        return Instance([plan_of(request)] * tp, state_groups=(16, 8, 8))

    # x 16, one group of B and C (8 each): TP 2 raises the groups to 2, 8 + 8 + 8 per rank.
    with pytest.raises(TransferRefused) as error:
        compile_transfer(side(1, 32), side(2, 24))
    assert error.value.what == "tensor_parallel_size"
    assert error.value.field == "layers['model.layers.0.mixer'].state0"


@pytest.mark.parametrize(("source_tp", "destination_tp"), [(1, 2), (2, 1), (4, 2), (1, 4)])
def test_a_state_the_same_on_every_rank_moves_whole_from_one_rank(
        source_tp: int, destination_tp: int) -> None:
    """ZAYA1's CCA states (vLLM's `is_kv_cache_tp_replicated`) are not sharded: each
    destination rank reads them whole from one source rank, the ranks taking turns."""
    def side(tp: int) -> Instance:
        state = {"kind": "mamba", "state_shapes": [[12, 4], [6]],
                 "state_dtypes": ["bfloat16", "bfloat16"], "block_size": 16}
        layers = {"model.layers.0.cca": state} | attention_layers(1, 4 // tp, block=16,
                                                                  first=1)
        request = vllm_request(layers, layout="BLNHC", available=2**40, max_model_len=512)
        request["device"]["num_blocks_override"] = 48
        return Instance([plan_of(request)] * tp, total_kv_heads=4)

    src, dst = side(source_tp), side(destination_tp)
    request = request_for(src, dst)
    program, wrong = roundtrip(src, dst, request, states={0: None, 1: None})
    assert wrong == 0
    pattern = compile_transfer(src, dst)
    check_pattern(pattern, src, dst)
    readers: dict[int, set[int]] = {}
    for row in program.rows:
        if row.layer == "model.layers.0.cca":
            readers.setdefault(row.dst_rank, set()).add(row.src_rank)
    assert sorted(readers) == list(range(destination_tp))
    assert all(len(ranks) == 1 for ranks in readers.values())
    assert len({min(ranks) for ranks in readers.values()}) == min(source_tp, destination_tp)


def test_states_between_engines_are_still_refused_across_tp() -> None:
    with pytest.raises(TransferRefused) as error:
        compile_transfer(mamba_side("vllm", 1), mamba_side("sglang", 2))
    assert error.value.what in ("tensor_parallel_size", "state0.shape")


# ---- pipeline parallelism ------------------------------------------------------------------

@pytest.mark.parametrize(("source", "destination"), [
    ((2, 1), (1, 2)), ((2, 2), (4, 1)), ((1, 1), (2, 2)), ((4, 1), (2, 1))])
def test_sglang_pipeline_stages_move_stage_to_stage(source: tuple[int, int],
                                                    destination: tuple[int, int]) -> None:
    src, dst = sglang_stages(*source), sglang_stages(*destination)
    request = request_for(src, dst, 90)
    program, wrong = roundtrip(src, dst, request)
    assert wrong == 0
    pattern = compile_transfer(src, dst)
    check_pattern(pattern, src, dst)
    # Each layer from the ranks of its prefill stage to those of its decode stage.
    for row in program.rows:
        assert row.layer in src.plans[row.src_rank].tensors[0].layers
        assert row.layer in dst.plans[row.dst_rank].tensors[0].layers


def test_vllm_pipeline_stages_into_sglang_stages() -> None:
    src, dst = vllm_stages(2, 2, heads=8), sglang_stages(2, 1, heads=8)
    assert [pool.name for pool in src.plans[0].pools] == ["device.0", "device.1"]
    program, wrong = roundtrip(src, dst, request_for(src, dst, 90))
    assert wrong == 0
    # Layers 0-1 from vLLM's stage-0 pool into SGLang's pipeline rank 0, 2-3 from stage 1's.
    for row in program.rows:
        stage = int(row.layer.split(".")[2]) // 2
        assert (row.src_region, row.dst_rank) == (f"device.{stage}", stage)


def test_pipeline_stages_that_share_layers_are_refused() -> None:
    one = sglang_stages(2, 1)
    whole = sglang_stages(1, 1)
    mixed = Instance([one.plans[0], whole.plans[0]], total_kv_heads=4)
    with pytest.raises(TransferRefused) as error:
        compile_transfer(mixed, whole)
    assert error.value.what == "layers"
