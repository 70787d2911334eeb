"""`hisparse-plan transfer SOURCE DESTINATION`: rows, descriptors and bytes of one request's
move, proved; the program as JSON; the refusal in one line."""

from __future__ import annotations

from pathlib import Path

from hisparse_plan.exchange.transfer import (
    Instance,
    TransferProgram,
    TransferRequest,
    check_transfer,
)
from support.cli_support import Run
from support.transfer_support import attention_layers, sglang_plan, vllm_plan


def files(tmp_path: Path) -> tuple[str, str, str]:
    layers = attention_layers(2, 2, block=16)
    paths = []
    for name, plan in (("a", vllm_plan(layers, layout="BLNHC", blocks=40)),
                       ("b", sglang_plan(layers, page=16)),
                       ("c", vllm_plan(attention_layers(2, 2, dtype="float16"), blocks=40))):
        path = tmp_path / f"{name}.json"
        path.write_text(plan.model_dump_json())
        paths.append(str(path))
    return paths[0], paths[1], paths[2]


def test_transfer_prints_rows_descriptors_and_bytes(cli: Run, tmp_path: Path) -> None:
    a, b, _ = files(tmp_path)
    code, out, err = cli("transfer", a, b, "--tokens", "100", "--plain")
    assert (code, err) == (0, "")
    assert "layers moved                     2" in out
    # 2 layers x 2 heads x 112 tokens (the last SGLang page) x K and V of 32 bytes.
    assert f"bytes                            {2 * 2 * 112 * 64} " in out
    assert "0:device        0:kv" in out


def test_transfer_json_is_the_program_and_it_is_proved(cli: Run, tmp_path: Path) -> None:
    a, b, _ = files(tmp_path)
    code, out, _ = cli("transfer", a, b, "--tokens", "100", "--run", "2", "--json")
    assert code == 0
    program = TransferProgram.model_validate_json(out)
    assert program.request.source_blocks["group.0"] == [1, 2, 4, 5, 7, 8, 10]
    source = Instance([vllm_plan(attention_layers(2, 2, block=16), layout="BLNHC",
                                 blocks=40)])
    destination = Instance([sglang_plan(attention_layers(2, 2, block=16), page=16)])
    check_transfer(program, source, destination)


def test_transfer_takes_the_requests_blocks_from_a_file(cli: Run, tmp_path: Path) -> None:
    a, b, _ = files(tmp_path)
    request = TransferRequest(num_tokens=20, source_blocks={"group.0": [7, 3]},
                              destination_blocks={"full": [9, 4]})
    path = tmp_path / "request.json"
    path.write_text(request.model_dump_json())
    code, out, _ = cli("transfer", a, b, "--blocks", str(path), "--json")
    assert code == 0
    assert TransferProgram.model_validate_json(out).request == request


def test_a_refused_pair_is_one_error_line(cli: Run, tmp_path: Path) -> None:
    a, _, c = files(tmp_path)
    code, out, err = cli("transfer", a, c, "--tokens", "10")
    assert (code, out) == (2, "")
    assert err.count("\n") == 1
    assert "layer 'model.layers.0.self_attn.attn': k.dtype differs" in err


def test_bad_input_is_refused(cli: Run, tmp_path: Path) -> None:
    a, b, _ = files(tmp_path)
    assert cli("transfer", "-", "-")[0] == 2
    (tmp_path / "bad.json").write_text('{"engine": "sglang"}')
    code, _, err = cli("transfer", a, str(tmp_path / "bad.json"))
    assert code == 2
    assert "DESTINATION" in err
    code, _, err = cli("transfer", a, b, "--tokens", "100000")
    assert code == 2
    assert "the pool has" in err


def test_transfer_without_a_request_prints_the_proved_pattern(cli: Run, tmp_path: Path) -> None:
    from hisparse_plan.exchange.transfer import TransferPattern

    a, b, _ = files(tmp_path)
    code, out, err = cli("transfer", a, b, "--plain")
    assert code == 0, err
    assert "the pattern for any request" in out
    assert "proved by check_pattern" in out
    assert "staged (proved by check_staged)" in out
    assert "loopback (NIXL over UCX, DRAM)" in out
    assert "GPU link (RDMA into HBM)" in out
    code, out, _ = cli("transfer", a, b, "--json")
    assert code == 0
    pattern = TransferPattern.model_validate_json(out)
    assert pattern.rows
    assert pattern.links
