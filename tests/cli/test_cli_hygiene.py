"""Input hygiene at the command line: duplicate keys, capped and short-quoted input, files that
cannot be requests, absurd numbers, exit codes, Ctrl-C; whatever comes in, the answer is a
result or one `error:` line, never a traceback."""

from __future__ import annotations

import io
import json
import os
import re
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hisparse_plan.cli import input_files
from hisparse_plan.cli import main as cli_main
from hisparse_plan.cli.errors import one_line
from hisparse_plan.cli.main import main
from hisparse_plan.models import untrusted_json
from support.cli_support import Run
from support.golden import GOLDEN

REQUEST = GOLDEN / "deepseek_v32_fp8.request.json"
LAYER = "model.layers.0.self_attn.attn"
PRINTS = re.compile(r"(?<![\w.])print\(|sys\.(stdout|stderr)\.write")
MAX_LINE = 1000
"""No error line may be longer (a few hundred characters of message, 200 of input)."""


def one_error(code: int, out: str, err: str, expected_code: int = 2) -> str:
    """The single `error:` line of a refusal, with nothing on stdout."""
    assert code == expected_code, err
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ")
    assert len(lines[0]) <= MAX_LINE
    return lines[0]


def write(tmp_path: Path, text: str, name: str = "request.json") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# -- duplicate keys --------------------------------------------------------------------------------


def test_duplicate_keys_name_the_key_and_its_path(cli: Run, tmp_path: Path) -> None:
    text = REQUEST.read_text()
    # The same layer spec twice in one object: `"kind": "mla", ..., "kind": "mla"`.
    spec_start = text.index("{", text.index(json.dumps(LAYER)))
    doubled = text[: spec_start + 1] + '"kind": "mla", ' + text[spec_start + 1:]
    line = one_error(*cli("plan", "--request", write(tmp_path, doubled)))
    assert f"layers['{LAYER}'].kind: duplicate key 'kind' in layers['{LAYER}']" in line
    top = '{"model": {}, ' + text.lstrip()[1:]
    line = one_error(*cli("plan", "--request", write(tmp_path, top)))
    assert "model: duplicate key 'model' in the top-level object" in line


# -- errors quote short excerpts -------------------------------------------------------------------


def _big_requests() -> dict[str, str]:
    data = json.loads(REQUEST.read_text())
    padding = "x" * 14_000_000
    wrong_type = json.loads(REQUEST.read_text())
    wrong_type["model"]["max_model_len"] = padding  # a 14 MB string where a number goes
    long_name = json.loads(REQUEST.read_text())
    long_name["layers"][padding[:2_000_000]] = {"kind": "mla", "block_size": "x"}
    return {
        "broken at the end": json.dumps(data) + " " * 14_000_000 + "]",
        "14 MB value of the wrong type": json.dumps(wrong_type),
        "2 MB layer name": json.dumps(long_name),
        "not an object": json.dumps([padding]),
    }


@pytest.mark.parametrize("case", sorted(_big_requests()))
def test_errors_quote_a_short_excerpt(cli: Run, tmp_path: Path, case: str) -> None:
    line = one_error(*cli("plan", "--request", write(tmp_path, _big_requests()[case])))
    assert "characters cut" in line or case == "broken at the end"
    assert "x" * 300 not in line


def test_messages_we_did_not_write_are_cut_too(cli: Run, tmp_path: Path) -> None:
    config = write(tmp_path, json.dumps({"num_hidden_layers": "9" * 100_000}), "config.json")
    line = one_error(*cli("plan", "--hf-config", config))
    assert "num_hidden_layers" in line
    assert "9" * 300 not in line
    spaced = one_line(ValueError("word " * 3_000_000))
    assert len(spaced) <= MAX_LINE
    assert "characters cut" in spaced


# -- files that cannot be requests ---------------------------------------------------------------


@pytest.mark.parametrize(("flag", "path", "kind"), [
    ("--request", "/dev/zero", "a character device"),
    ("--hf-config", "/dev/zero", "a character device"),
    ("--request", "/", "a directory"),
])
def test_non_regular_files_are_refused_unread(
    cli: Run, flag: str, path: str, kind: str
) -> None:
    line = one_error(*cli("plan", flag, path))
    assert line == f"error: {flag} {path}: {kind}; expected a regular file"


def test_a_fifo_is_refused_without_waiting_for_a_writer(cli: Run, tmp_path: Path) -> None:
    fifo = tmp_path / "request.fifo"
    os.mkfifo(fifo)
    line = one_error(*cli("plan", "--request", str(fifo)))
    assert line.endswith("a FIFO (named pipe); expected a regular file")


def test_requests_are_capped(
    cli: Run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw = REQUEST.read_bytes()
    monkeypatch.setattr(input_files, "MAX_INPUT_BYTES", len(raw))
    code, _, err = cli("plan", "--request", str(REQUEST), "--json")
    assert code == 0, err  # exactly at the cap
    monkeypatch.setattr(input_files, "MAX_INPUT_BYTES", len(raw) - 1)
    line = one_error(*cli("plan", "--request", str(REQUEST)))
    assert f"expected at most {len(raw) - 1} bytes" in line
    assert f"got {len(raw)} bytes" in line
    monkeypatch.setattr(untrusted_json, "MAX_CONFIG_BYTES", len(raw) - 1)
    line = one_error(*cli("plan", "--hf-config", str(REQUEST)))
    assert f"--hf-config {REQUEST}: expected at most {len(raw) - 1} bytes" in line


def test_stdin_is_read_up_to_the_cap_and_no_further(
    cli: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw = REQUEST.read_bytes()
    endless = io.BytesIO(raw + b" " * 10_000)
    monkeypatch.setattr(sys, "stdin", types.SimpleNamespace(buffer=endless))
    monkeypatch.setattr(input_files, "MAX_INPUT_BYTES", len(raw) + 100)
    line = one_error(*cli("plan", "--request", "-"))
    assert "--request - (standard input): expected at most" in line
    assert endless.tell() == len(raw) + 101  # the cap and one byte, nothing more
    monkeypatch.setattr(sys, "stdin", types.SimpleNamespace(buffer=io.BytesIO(raw)))
    code, _, err = cli("plan", "--request", "-", "--json")
    assert code == 0, err


# -- absurd numbers --------------------------------------------------------------------------------


@pytest.mark.parametrize(("argv", "fragment"), [
    (["tune", "deepseek-v3.2", "--target", "1e308"], "argument --target: expected a target of "
     "at most 9223372036854775807"),
    (["tune", "deepseek-v3.2", "--target", "nan"], "argument --target: expected a target above 0"),
    (["tune", "deepseek-v3.2", "--target", "inf"], "argument --target: expected a target above 0"),
    (["tune", "deepseek-v3.2", "--target=-1"], "argument --target: expected a target above 0"),
    (["tune", "deepseek-v3.2", "--target", "1e18"], "the GPU binds"),
    (["tune", "deepseek-v3.2", "--dram", "8191PiB"], "host pool"),
    (["plan", "deepseek-v3.2", "--gpu-mem", "9EiB"],
     "argument --gpu-mem: invalid size '9EiB': expected at most 9223372036854775807 bytes"),
    (["plan", "deepseek-v3.2", "--host-pool", "1e30"], "argument --host-pool: invalid size"),
    (["plan", "deepseek-v3.2", "--host-pool", "9223372036854775808"],
     "argument --host-pool: invalid size"),
    (["plan", "deepseek-v3.2", "--host-pool", "8191PiB"], "host"),
    (["plan", "deepseek-v3.2", "--max-model-len", "99999999999999999999m"],
     "argument --max-model-len: invalid token count"),
    (["plan", "deepseek-v3.2", "--tp", "99999999999999999999999"],
     "argument -tp/--tensor-parallel-size/--tp: expected at most 9223372036854775807"),
    (["plan", "deepseek-v3.2", "--block-size", "99999999999999999"], "does not fit in int64"),
    (["plan", "deepseek-v3.2", "--spec-tokens", "1" * 5000], "argument --spec-tokens"),
])
def test_absurd_numbers_are_one_line(cli: Run, argv: list[str], fragment: str) -> None:
    assert fragment in one_error(*cli(*argv))


# -- exit codes, interrupts ------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [["--help"], ["plan", "--help"], ["verify", "--help"]])
def test_help_documents_the_exit_codes(cli: Run, argv: list[str]) -> None:
    code, out, _ = cli(*argv)
    assert code == 0
    flat = " ".join(out.split())
    assert cli_main.EXIT_CODES in flat
    for words in ("0 done", "1 a check ran and found a fault", "2 a refusal",
                  "130 interrupted (Ctrl-C)"):
        assert words in flat


@pytest.mark.parametrize("where", ["parsing", "planning"])
def test_ctrl_c_exits_130_in_one_line(
    cli: Run, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    def interrupt(*args: object, **kwargs: object) -> Any:
        raise KeyboardInterrupt

    target = "build_parser" if where == "parsing" else "vllm.plan_command.make_plan"
    monkeypatch.setattr(f"hisparse_plan.cli.main.{target}" if where == "parsing"
                        else f"hisparse_plan.cli.{target}", interrupt)
    assert one_error(*cli("plan", "glm-5"), expected_code=130) == "error: interrupted"


# -- nothing escapes ------------------------------------------------------------------------------


@pytest.mark.parametrize("error", [
    RuntimeError("boom\nsecond line"), AttributeError("boom\nsecond line"),
    TypeError("boom\nsecond line"),
])
def test_internal_errors_are_one_line_too(
    cli: Run, monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    def broken(request: object) -> object:
        raise error

    monkeypatch.setattr("hisparse_plan.cli.vllm.plan_command.make_plan", broken)
    code, out, err = cli("plan", "glm-5")
    assert (code, out) == (2, "")
    name = type(error).__name__
    assert err == (f"error: internal error, please report it: {name}: boom second line "
                   f"(set {cli_main.DEBUG_ENV}=1 for the traceback)\n")
    monkeypatch.setenv(cli_main.DEBUG_ENV, "1")
    with pytest.raises(type(error)):
        main(["plan", "glm-5"])


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                max_size=3),
    max_leaves=6,
)


def _paths(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [path]
    if isinstance(node, dict):
        for key, child in node.items():
            found += _paths(child, (*path, key))
    elif isinstance(node, list):
        for index, child in enumerate(node):
            found += _paths(child, (*path, index))
    return found


SMALL_REQUEST = json.loads((GOLDEN / "glm5_fp8_blhnc.request.json").read_text())
SMALL_PATHS = _paths(SMALL_REQUEST)[1:]


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(where=st.sampled_from(SMALL_PATHS), value=JSON_VALUES, command=st.sampled_from(
    ["plan", "capacity", "explain", "manifest"]))
def test_nothing_but_a_result_or_one_refusal(
    tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str],
    where: tuple[Any, ...], value: Any, command: str,
) -> None:
    """Any field of a request replaced by any JSON value: exit 0, or one `error:` line with
    exit 2 that is a refusal, not an internal error."""
    request = json.loads(json.dumps(SMALL_REQUEST))
    node = request
    for step in where[:-1]:
        node = node[step]
    node[where[-1]] = value
    path = tmp_path_factory.mktemp("fuzz") / "request.json"
    path.write_text(json.dumps(request))
    code = main([command, "--request", str(path), "--json"])
    out, err = capsys.readouterr()
    if code == 0:
        json.loads(out)
        return
    assert "internal error" not in err
    one_error(code, out, err)


def test_only_the_cli_prints() -> None:
    """Library code reports through return values, exceptions and logging; the command line
    is the one place that writes to the terminal."""
    package = Path(cli_main.__file__).resolve().parent.parent
    for path in package.rglob("*.py"):
        if "cli" in path.relative_to(package).parts[:1]:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#")[0]
            assert not PRINTS.search(code), f"{path}:{number}"
