"""Untrusted input and a hostile terminal at the command line: plans that diff must prove first,
layer names that carry escapes, closed standard streams, numbers too long to convert, sweeps
too long to run, and a schema that says which draft it is."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import hisparse_plan as hp
from hisparse_plan.cli.main import main
from support.cli_support import Run
from support.golden import GOLDEN

REQUEST = GOLDEN / "bf16_small_with_full_attention.request.json"
HOSTILE = "model.layers.0.attn\x1b[2J\x1b]0;owned\x07\nerror: fake\r\u202e"
ESCAPED = repr(HOSTILE)[1:-1]
GIANT = "9" * 5000


def one_error(code: int, out: str, err: str) -> str:
    """The single `error:` line of a refusal (exit 2), with nothing on stdout."""
    assert code == 2, (code, err)
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ")
    assert "internal error" not in lines[0]
    return lines[0]


def _plan(tmp_path: Path, name: str, tamper: Any = None) -> str:
    dumped = hp.plan(json.loads(REQUEST.read_text())).model_dump(mode="json")
    if tamper is not None:
        tamper(dumped)
    path = tmp_path / name
    path.write_text(json.dumps(dumped))
    return str(path)


def _no_layer_stride(plan: dict[str, Any]) -> None:
    for tensor in plan["tensors"]:
        if len(tensor["layers"]) > 1:
            tensor["layer_stride"] = 0
            return
    raise AssertionError("no tensor of two layers")


def _far_offset(plan: dict[str, Any]) -> None:
    plan["tensors"][0]["offset"] = 10**12


@pytest.mark.parametrize(("tamper", "fault"), [
    (_no_layer_stride, "share byte"), (_far_offset, "pool's 1073479680 bytes"),
])
def test_diff_proves_both_plans_first(
    cli: Run, tmp_path: Path, tamper: Any, fault: str
) -> None:
    """Two copies of one broken plan are transfer-compatible with each other, and unusable."""
    sound = _plan(tmp_path, "sound.json")
    broken = _plan(tmp_path, "broken.json", tamper)
    line = one_error(*cli("diff", broken, broken))
    assert broken in line
    assert fault in line
    line = one_error(*cli("diff", sound, broken, "--json"))
    assert broken in line
    code, _, _ = cli("diff", sound, sound)
    assert code == 0


def _hostile_request(tmp_path: Path) -> str:
    data = json.loads(REQUEST.read_text())
    first = next(iter(data["layers"]))
    data["layers"] = {(HOSTILE if name == first else name): spec
                      for name, spec in data["layers"].items()}
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps(data))
    return str(path)


def _assert_escaped(out: str) -> None:
    assert all(char.isprintable() or char == "\n" for char in out), [
        line for line in out.splitlines() if not line.isprintable()]
    assert "error: fake" not in out.splitlines()


@pytest.mark.parametrize("command", [["plan"], ["manifest"], ["explain"]])
def test_layer_names_reach_the_terminal_escaped(
    cli: Run, tmp_path: Path, renderer: str, command: list[str]
) -> None:
    code, out, err = cli(*command, "--request", _hostile_request(tmp_path))
    assert code == 0, err
    _assert_escaped(out)
    _assert_escaped(err)
    if command == ["manifest"]:
        assert ESCAPED in out


def test_a_refusal_naming_a_hostile_layer_is_escaped(cli: Run, tmp_path: Path) -> None:
    data = json.loads(REQUEST.read_text())
    data["layers"][HOSTILE] = {"kind": "full_attention", "block_size": 7, "head_size": 1,
                               "num_kv_heads": 1}
    path = tmp_path / "refused.json"
    path.write_text(json.dumps(data))
    line = one_error(*cli("plan", "--request", str(path)))
    _assert_escaped(line)


def test_closed_standard_input_is_one_error_line(
    cli: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Python sets sys.stdin to None when descriptor 0 is closed (`<&-`)."""
    monkeypatch.setattr(sys, "stdin", None)
    line = one_error(*cli("plan", "--request", "-"))
    assert "standard input" in line


def test_closed_standard_output_is_one_error_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Python sets sys.stdout to None when descriptor 1 is closed (`>&-`); JSON output would
    vanish silently, so the command refuses instead."""
    for extra in ([], ["--json"]):
        with monkeypatch.context() as patch:
            patch.setattr(sys, "stdout", None)
            code = main(["plan", "--request", str(REQUEST), *extra])
        out, err = capsys.readouterr()
        line = one_error(code, out, err)
        assert "standard output" in line


def test_closed_standard_error_keeps_stdout_clean(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """With descriptor 2 closed, a refusal still exits 2, and prints nothing to stdout."""
    monkeypatch.setattr(sys, "stderr", None)
    code = main(["plan", "--request", "/nonexistent/request.json"])
    out, _ = capsys.readouterr()
    assert code == 2
    assert out == ""


def test_closed_standard_error_in_a_real_process(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        ["sh", "-c", 'exec "$@" 2>&-', "sh", sys.executable, "-m", "hisparse_plan.cli",
         "plan", "--request", str(tmp_path / "missing.json")],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )
    assert done.returncode == 2
    assert done.stdout == ""


def test_giant_integers_are_refused_in_one_line(cli: Run, tmp_path: Path) -> None:
    """Python refuses to convert integers of more than 4300 digits; that is bad input."""
    config = tmp_path / "config.json"
    config.write_text('{"model_type": "deepseek_v32", "num_hidden_layers": ' + GIANT + "}")
    line = one_error(*cli("plan", "--hf-config", str(config)))
    assert "digits" in line
    assert "set_int_max_str_digits" not in line
    request = REQUEST.read_text().replace('"max_model_len": ', '"max_model_len": ' + GIANT, 1)
    giant_request = tmp_path / "request.json"
    giant_request.write_text(request)
    for command in (["plan"], ["explain"], ["manifest"], ["capacity"]):
        line = one_error(*cli(*command, "--request", str(giant_request)))
        assert "digits" in line
    giant_plan = tmp_path / "plan.json"
    sound = _plan(tmp_path, "sound.json")
    giant_plan.write_text(Path(sound).read_text().replace(
        '"num_blocks": ', '"num_blocks": ' + GIANT, 1))
    one_error(*cli("diff", str(giant_plan), sound))


def test_sweep_points_are_capped(cli: Run) -> None:
    points = ",".join(str(4096 + i) for i in range(1001))
    line = one_error(*cli("capacity", "deepseek-v3.2", "--sweep", "max-model-len",
                          "--points", points))
    assert "at most 1000 points, got 1001" in line


def test_schema_declares_its_draft(cli: Run) -> None:
    draft = "https://json-schema.org/draft/2020-12/schema"
    code, out, _ = cli("schema")
    assert code == 0
    both = json.loads(out)
    assert both["request"]["$schema"] == draft
    assert both["plan"]["$schema"] == draft
    for which in ("request", "plan"):
        code, out, _ = cli("schema", which)
        assert json.loads(out)["$schema"] == draft
        assert copy.deepcopy(json.loads(out)) == json.loads(out)
