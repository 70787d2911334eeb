"""The reference executor copies exactly a program's rows between two sets of buffers, and
the round trip through the plans' own views finds every byte where it belongs."""

from __future__ import annotations

import numpy as np
import pytest

from hisparse_plan.exchange.transfer import (
    Instance,
    RankRegions,
    Region,
    TransferCheckError,
    TransferProgram,
    TransferRequest,
    TransferRow,
)
from hisparse_plan.exchange.transfer.executors.reference import buffers, execute
from support.transfer_support import (
    attention_layers,
    count_wrong,
    request_blocks,
    roundtrip,
    vllm_plan,
)


def program(rows: list[TransferRow]) -> TransferProgram:
    ranks = [RankRegions(rank=0, engine="vllm", regions=[
        Region(name="a", pool="a", layer=None, location="device", size=64)])]
    request = TransferRequest(num_tokens=1, source_blocks={}, destination_blocks={})
    return TransferProgram(request=request, source=ranks, destination=ranks, layers=[],
                           rows=rows)


def test_rows_copy_their_chunks_and_nothing_else() -> None:
    rows = [
        TransferRow(src_rank=0, src_region="a", src_offset=0, length=4, count=3, src_stride=8,
                    dst_rank=0, dst_region="a", dst_offset=40, dst_stride=5, layer="l"),
        TransferRow(src_rank=0, src_region="a", src_offset=60, length=2, count=1, src_stride=0,
                    dst_rank=0, dst_region="a", dst_offset=0, dst_stride=0, layer="l"),
    ]
    made = program(rows)
    source = {(0, "a"): np.arange(64, dtype=np.uint8)}
    destination = buffers(made.destination, fill=255)
    execute(made, source, destination)
    expected = np.full(64, 255, dtype=np.uint8)
    expected[40:44], expected[45:49], expected[50:54] = [0, 1, 2, 3], [8, 9, 10, 11], \
        [16, 17, 18, 19]
    expected[0:2] = [60, 61]
    assert destination[(0, "a")].tolist() == expected.tolist()


def test_a_row_past_its_buffer_is_refused() -> None:
    made = program([TransferRow(src_rank=0, src_region="a", src_offset=60, length=8, count=1,
                                src_stride=0, dst_rank=0, dst_region="a", dst_offset=0,
                                dst_stride=0, layer="l")])
    with pytest.raises(TransferCheckError, match="leave a buffer of 64 bytes"):
        execute(made, buffers(made.source), buffers(made.destination))


@pytest.mark.parametrize(("source", "destination"), [("BLNHC", "LBHNC"), ("BHLNC", "BLHNC")])
def test_a_round_trip_through_the_plans_views_finds_every_byte(source: str, destination: str
                                                                ) -> None:
    src = Instance([vllm_plan(attention_layers(2, 2, block=16), layout=source)])
    dst = Instance([vllm_plan(attention_layers(2, 2, block=32), layout=destination)])
    request = TransferRequest(num_tokens=70, source_blocks=request_blocks(src, 70, 3),
                              destination_blocks=request_blocks(dst, 70, 4))
    made, wrong = roundtrip(src, dst, request)
    assert made.bytes == 2 * 2 * 80 * 64  # layers x heads x tokens (to 80) x K and V bytes
    assert wrong == 0


def test_the_round_trip_sees_a_misplaced_byte() -> None:
    """The oracle is not blind: one row written one head off is found."""
    src = Instance([vllm_plan(attention_layers(1, 2, block=16), layout="LBHNC")])
    request = TransferRequest(num_tokens=32, source_blocks={"group.0": [1, 2]},
                              destination_blocks={"group.0": [5, 6]})
    made, wrong = roundtrip(src, src, request)
    assert wrong == 0
    row = made.rows[0]
    shifted = made.model_copy(update={"rows": [row.model_copy(
        update={"dst_offset": row.dst_offset + 64})]})
    assert count_wrong(src, src, request, shifted) > 0


def test_the_package_imports_neither_numpy_nor_nixl() -> None:
    import subprocess
    import sys

    code = ("import sys, hisparse_plan.exchange.transfer; "
            "print(sorted({'numpy', 'nixl_cu12'} & set(sys.modules)))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert result.stdout.strip() == "[]"
