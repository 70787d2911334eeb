"""`hisparse-plan manifest` and `hisparse-plan diff`."""

from __future__ import annotations

import io
import json
import sys
import types
from pathlib import Path

import pytest

import hisparse_plan as hp
from hisparse_plan.exchange import TransferCompatibility, TransferManifest, manifest
from support.cli_support import Run
from support.golden import GOLDEN

REQUEST = str(GOLDEN / "deepseek_v32_fp8.request.json")
INDEXER_1 = "model.layers.1.self_attn.indexer.k_cache"


def saved(cli: Run, tmp_path: Path, name: str, *argv: str) -> str:
    code, out, err = cli(*argv, "--json")
    assert code == 0, err
    path = tmp_path / name
    path.write_text(out)
    return str(path)


def one_error(code: int, out: str, err: str, expected_code: int) -> str:
    assert code == expected_code, err
    assert out == ""
    assert len(err.splitlines()) == 1, err
    assert err.startswith("error: ")
    return err.strip()


def test_manifest_json_is_the_library_manifest(cli: Run) -> None:
    code, out, err = cli("manifest", "--request", REQUEST, "--json")
    assert (code, err) == (0, "")
    result = TransferManifest.model_validate_json(out)
    plan = hp.plan(hp.PlanRequest.model_validate_json(Path(REQUEST).read_text()))
    assert result == manifest(plan)
    assert [region.name for region in result.regions] == ["host", "device"]
    assert len(result.layers) == 244


def test_manifest_summary(cli: Run) -> None:
    # The request file names BLNHC; the preset on its own takes vLLM's BLHNC.
    code, out, err = cli("manifest", "deepseek-v3.2", "--layout", "BLNHC", "--plain")
    assert (code, err) == (0, "")
    plan = hp.plan(hp.PlanRequest.model_validate_json(Path(REQUEST).read_text()))
    assert manifest(plan).fingerprint in out
    lines = out.splitlines()
    host = next(line for line in lines if line.startswith("host "))
    assert host.split()[1:] == ["68717395968", "1", "26832", "2561024", "2561024", "LBNHC",
                                "no"]
    tensor_0 = next(line for line in lines if line.split()[:2] == ["0", "host"])
    assert tensor_0.split()[2:] == ["0", "1126514688", "41984", "41984", "uint8",
                                    "(1,64,656)", "(656,656,1)"]
    assert any("(derived on the GPU, not transferred)" in line for line in lines)


def test_diff_of_two_plans_of_one_request(cli: Run, tmp_path: Path) -> None:
    a = saved(cli, tmp_path, "a.json", "plan", "--request", REQUEST)
    b = saved(cli, tmp_path, "b.json", "manifest", "deepseek-v3.2", "--layout", "BLNHC")
    code, out, err = cli("diff", a, b)
    assert (code, err) == (0, "")
    assert "transfer-compatible" in out
    assert "(same fingerprint)" in out


def test_diff_of_different_pool_sizes(cli: Run, tmp_path: Path) -> None:
    prefill = saved(cli, tmp_path, "prefill.json", "plan", "deepseek-v3.2")
    decode = saved(cli, tmp_path, "decode.json", "plan", "deepseek-v3.2", "--gpu-mem", "100GiB",
                   "--host-pool", "256GiB")
    code, out, _ = cli("diff", prefill, decode, "--json")
    assert code == 0
    result = TransferCompatibility.model_validate_json(out)
    assert result.compatible
    assert not result.same_fingerprint


def test_diff_names_the_first_layer_that_differs(cli: Run, tmp_path: Path) -> None:
    plan = json.loads(Path(saved(cli, tmp_path, "a.json", "plan", "deepseek-v3.2")).read_text())
    plan["tensors"][1]["layer_stride"] += 132
    changed = tmp_path / "changed.json"
    changed.write_text(json.dumps(plan))
    line = one_error(*cli("diff", str(tmp_path / "a.json"), str(changed)), expected_code=1)
    assert line == (f"error: not transfer-compatible: layer '{INDEXER_1}': block_offset "
                    "differs: A has 8448, B has 8580")
    code, out, err = cli("diff", str(tmp_path / "a.json"), str(changed), "--json")
    assert (code, err) == (1, "")
    result = TransferCompatibility.model_validate_json(out)
    assert (result.layer, result.field) == (INDEXER_1, "block_offset")
    glm = saved(cli, tmp_path, "glm.json", "manifest", "glm-5")
    line = one_error(*cli("diff", str(tmp_path / "a.json"), glm), expected_code=1)
    assert "'model.layers.61.self_attn.attn' is transferred by B only" in line


def test_diff_refuses_bad_input(cli: Run, tmp_path: Path) -> None:
    good = saved(cli, tmp_path, "a.json", "plan", "deepseek-v3.2")
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    not_a_plan = tmp_path / "request.json"
    not_a_plan.write_text(Path(REQUEST).read_text())
    bad_manifest = tmp_path / "manifest.json"
    bad_manifest.write_text('{"manifest_version": 1, "fingerprint": "x"}')
    twice = tmp_path / "twice.json"
    twice.write_text('{"num_blocks": 1, ' + Path(good).read_text().lstrip()[1:])
    cases = {
        str(tmp_path / "missing.json"): "No such file or directory",
        "/dev/zero": "a character device; expected a regular file",
        str(broken): "Invalid JSON",
        str(not_a_plan): "not a valid plan (or a manifest with manifest_version)",
        str(bad_manifest): "not a valid manifest: fingerprint",
        str(twice): "num_blocks: duplicate key 'num_blocks'",
    }
    for path, fragment in cases.items():
        assert fragment in one_error(*cli("diff", good, path), expected_code=2)
    assert "cannot both be '-'" in one_error(*cli("diff", "-", "-"), expected_code=2)
    assert "the following arguments are required" in one_error(
        *cli("diff", good), expected_code=2)


@pytest.mark.parametrize("command", ["manifest", "diff"])
def test_new_commands_are_listed(cli: Run, command: str) -> None:
    code, out, _ = cli("--help")
    assert code == 0
    assert command in out


def test_diff_reads_one_side_from_stdin(
    cli: Run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = saved(cli, tmp_path, "a.json", "plan", "deepseek-v3.2")
    monkeypatch.setattr(sys, "stdin", types.SimpleNamespace(
        buffer=io.BytesIO(Path(a).read_bytes())))
    code, out, err = cli("diff", "-", a)
    assert (code, err) == (0, "")
    assert "(same fingerprint)" in out
