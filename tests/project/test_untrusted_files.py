"""Untrusted files, wherever they come in (the command line, the presets API, the SGLang adapter):
one guarded reader refuses what is not a regular file before reading a byte of it, bounds
size and nesting, reads only UTF-8 and refuses a key named twice; a layer count no model has is
refused before anything is built per layer; and an adapter's arguments of the wrong kind are a
PlanError, never a TypeError, AttributeError, JSONDecodeError or RecursionError."""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import hisparse_plan
from hisparse_plan.adapters.sglang import request_from_server_args, request_from_sglang
from hisparse_plan.adapters.sglang.request import hisparse_settings, settings_from_server_args
from hisparse_plan.errors import PlanError
from hisparse_plan.models.any_plan import load_plan
from hisparse_plan.presets import (
    ConfigError,
    ModelArchitecture,
    architecture_from_config,
    load_config_file,
)
from hisparse_plan.presets import config_file as config_module
from hisparse_plan.presets.config_file import model_from_config
from hisparse_plan.presets.model_weights import INDEX_FILE, index_weights
from support import paths
from support.cli_support import Run

CONFIGS = paths.HF_CONFIGS
LLAMA = json.loads((CONFIGS / "llama-3.1-8b-instruct" / "config.json").read_text())
GEMMA3 = json.loads((CONFIGS / "gemma-3-27b-it" / "config.json").read_text())
"""A multimodal wrapper: the language model's fields under `text_config`."""
WRAPPER = {"model_type": "llama", "architectures": ["LlamaForCausalLM"]}
"""A Llama that names its class (SGLang's reading refuses a config without one first)."""
DSA = json.loads((CONFIGS / "deepseek-v3.2-exp" / "config.json").read_text())
MEMORY = {"available_bytes": 8 * 2**30}
SERVER_ARGS = {"tp_size": 1, "page_size": 64}
HUGE = [10**7, 10**9, 2**63]
"""Layer counts a 1 KB config.json can name; each once took gigabytes, or an internal error."""


def write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def one_error(code: int, out: str, err: str) -> str:
    """The single `error:` line of a refusal (exit 2), never an internal error."""
    assert (code, out) == (2, ""), err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ")
    assert "internal error" not in lines[0]
    return lines[0]


class BuiltPerLayer(Exception):
    """Something was built per layer before the layer count was checked. Not a ValueError, so
    that no validator turns it into a refusal."""


def _built(*args: object, **kwargs: object) -> Any:
    raise BuiltPerLayer


@pytest.fixture
def no_per_layer_lists(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make building anything per layer from a config (transformers' config class, the layer
    rules) fail loudly: a refusal must come before either."""
    monkeypatch.setattr(config_module, "transformers_text_fields", _built)
    monkeypatch.setattr(config_module, "layer_layout", _built)


@pytest.fixture
def no_leaders(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same for a sparse model's per-layer indexer leaders (not at the command line,
    which reads the presets' own models)."""
    monkeypatch.setattr(ModelArchitecture, "leaders", _built)


# -- layer counts no model has ----------------------------------------------------------------


def _counted(config: dict[str, Any], layers: int) -> dict[str, Any]:
    """`config` counting `layers` decoder layers where its language model keeps the count."""
    if "text_config" in config:
        return {**config, "text_config": {**config["text_config"], "num_hidden_layers": layers}}
    return {**config, "num_hidden_layers": layers}


@pytest.mark.usefixtures("no_per_layer_lists", "no_leaders")
@pytest.mark.parametrize("layers", HUGE)
@pytest.mark.parametrize("base", [LLAMA, GEMMA3, DSA], ids=["llama", "gemma3-wrapped", "dsa"])
def test_absurd_layer_counts_are_refused_before_any_list(
    tmp_path: Path, base: dict[str, Any], layers: int
) -> None:
    config = _counted(base, layers)
    path = write(tmp_path / "config.json", json.dumps(config))
    assert path.stat().st_size < 4096
    reads: list[Callable[[], object]] = [
        lambda: load_config_file(path), lambda: model_from_config(config, origin="c"),
        lambda: model_from_config(config, origin="c", use_transformers=False)]
    for read in reads:
        with pytest.raises(ConfigError, match="num_hidden_layers: expected at most 65536") as no:
            read()
        assert no.value.field is not None
        assert no.value.field.endswith("num_hidden_layers")


@pytest.mark.usefixtures("no_per_layer_lists")
@pytest.mark.parametrize("layers", HUGE)
def test_absurd_layer_counts_at_the_command_line(
    cli: Run, tmp_path: Path, layers: int
) -> None:
    path = write(tmp_path / "config.json", json.dumps({**LLAMA, "num_hidden_layers": layers}))
    line = one_error(*cli("plan", "--hf-config", str(path)))
    assert "num_hidden_layers: expected at most 65536 layers" in line


@pytest.mark.usefixtures("no_per_layer_lists", "no_leaders")
def test_a_sparse_config_refuses_absurd_counts_before_its_leaders() -> None:
    """A DSA config is read by pydantic alone: the bound is on its fields, so neither the
    decoder layers nor the MTP draft layers can ask for a list of 10**9 leaders."""
    for field in ("num_hidden_layers", "num_nextn_predict_layers"):
        with pytest.raises(ConfigError, match=field):
            architecture_from_config({**DSA, field: 10**9}, origin="c")
        with pytest.raises(ConfigError, match=field):
            architecture_from_config({**DSA, "text_config": {field: 10**9}}, origin="c")


def test_the_bound_itself_is_a_model() -> None:
    """MAX_LAYERS layers read; one more is refused (the bound is documented, not a guess)."""
    from hisparse_plan.presets.layer_count import MAX_LAYERS

    at = model_from_config({**LLAMA, "num_hidden_layers": MAX_LAYERS}, origin="c",
                           use_transformers=False)
    assert at.num_hidden_layers == MAX_LAYERS == 2**16
    with pytest.raises(ConfigError, match="num_hidden_layers"):
        model_from_config({**LLAMA, "num_hidden_layers": MAX_LAYERS + 1}, origin="c",
                          use_transformers=False)


# -- the command line: one clean line for every config ----------------------------------------


@pytest.mark.parametrize(("content", "fragment"), [
    (json.dumps({**LLAMA, "num_hidden_layers": 2**63}), "num_hidden_layers: expected at most"),
    (json.dumps({**WRAPPER, "text_config": {**LLAMA, "num_hidden_layers": 2}}), "text_config"),
    (json.dumps({**WRAPPER, "text_config": {"text_config": LLAMA}}), "text_config"),
    (json.dumps({"text_config": {"text_config": {"num_hidden_layers": 2}}}),
     "num_hidden_layers: missing"),
    (json.dumps({**GEMMA3, "text_config": 5}), "text_config"),
    (b'{"model_type": "llama", "name": "\xff\xfe"}', "byte 0xff at offset 33 is not UTF-8"),
    ('{"model_type": "llama", "model_type": "qwen2"}',
     "model_type: duplicate key 'model_type' in the top-level object"),
    ('{"a": ' * 100 + "1" + "}" * 100, "nested more than 64 levels deep"),
    ("[" * 5000 + "]" * 5000, "nested too deeply"),
])
def test_bad_configs_are_one_clean_line(
    cli: Run, tmp_path: Path, content: str | bytes, fragment: str
) -> None:
    path = write(tmp_path / "config.json", content)
    for engine in ([], ["--engine", "sglang"]):
        line = one_error(*cli("plan", "--hf-config", str(path), *engine))
        if engine and fragment == "num_hidden_layers: missing":
            # SGLang's own reading (targets/sglang/served/hf_config.py) wants a model_type first.
            assert "model_type: SGLang loads config.json through" in line, line
        else:
            assert fragment in line, line


def test_duplicate_keys_in_a_config_never_pick_a_copy(tmp_path: Path) -> None:
    """Which copy counts would be the parser's choice: a Qwen2 or a Llama, a window or not."""
    text = json.dumps(LLAMA)[:-1] + ', "num_hidden_layers": 2}'
    path = write(tmp_path / "config.json", text)
    with pytest.raises(ConfigError, match="num_hidden_layers: duplicate key") as refused:
        load_config_file(path)
    assert str(path) in str(refused.value)
    nested = write(tmp_path / "nested.json", '{"text_config": {"a": 1, "a": 2}}')
    with pytest.raises(ConfigError, match=r"text_config\.a: duplicate key 'a' in text_config"):
        load_config_file(nested)


# -- the SGLang adapter reads model_path/config.json through the same reader ------------------


def _sglang(model_path: Path, **given: object) -> SimpleNamespace:
    """An object with the attribute names of SGLang's ServerArgs."""
    fields: dict[str, object] = {
        "model_path": str(model_path), "tp_size": 1, "page_size": 64, "kv_cache_dtype": "auto",
        "context_length": 8192, "enable_hisparse": False, **given,
    }
    return SimpleNamespace(**fields)


def _entry_points(config: Path) -> list[Callable[[], object]]:
    """Every adapter call that reads `config`: by model_path, and by path."""
    return [lambda: request_from_sglang(_sglang(config.parent), MEMORY),
            lambda: request_from_server_args(config, SERVER_ARGS, MEMORY),
            lambda: request_from_server_args(str(config), SERVER_ARGS, MEMORY)]


def _raised(call: Callable[[], object], fifo: Path | None = None) -> BaseException | None:
    """What `call` raises. Where it waits on `fifo` for a writer (the fault under test), a
    writer comes and goes after a while, so the test ends either way; nothing is timed."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
        except BaseException as error:  # what escapes is what is tested
            outcome.append(error)
        else:
            outcome.append(None)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=None if fifo is None else 20)
    if thread.is_alive() and fifo is not None:
        with open(fifo, "wb"):  # unblocks the reader waiting in open(); then it reads EOF
            pass
        thread.join()
    return outcome[0]


def _fifo(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
    return path


def _socket(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.close()
    return path


def _link(target: str) -> Callable[[Path], Path]:
    def make(path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.symlink_to(target)
        return path
    return make


@pytest.mark.parametrize(("make", "kind"), [
    (_fifo, "a FIFO (named pipe); expected a regular file"),
    (_link("/dev/null"), "a character device; expected a regular file"),
    (_socket, "a socket; expected a regular file"),
    (lambda path: (path.mkdir(parents=True), path)[1], "a directory; expected a regular file"),
    (lambda path: write(path, b'{"model_type": "\xc3("}'), "is not UTF-8"),
    (lambda path: write(path, "[" * 5000 + "]" * 5000), "nested too deeply"),
    (lambda path: write(path, '{"x": ' * 65 + "0" + "}" * 65), "nested more than 64 levels"),
    (lambda path: write(path, json.dumps(DSA)[:-1] + ', "kv_lora_rank": 1}'),
     "kv_lora_rank: duplicate key"),
    (lambda path: path, "No such file or directory; expected a readable regular file"),
], ids=["fifo", "char-device", "socket", "directory", "not-utf8", "deep", "deep-objects",
        "duplicate-key", "missing"])
def test_the_sglang_adapter_reads_config_json_guarded(
    tmp_path: Path, make: Callable[[Path], Path], kind: str
) -> None:
    config = tmp_path / "model" / "config.json"
    made = make(config)
    for call in _entry_points(config):
        error = _raised(call, made if kind.startswith("a FIFO") else None)
        assert isinstance(error, PlanError), repr(error)
        assert str(config) in str(error)
        assert kind in str(error)


def test_a_symlink_to_dev_zero_is_refused_unread(tmp_path: Path) -> None:
    """Reading /dev/zero never ends: in a process of bounded memory, so that a reader that
    tries cannot take the machine's memory with it."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").symlink_to("/dev/zero")
    script = (
        "import resource, sys, types\n"
        "resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30))\n"
        "from hisparse_plan.adapters.sglang import request_from_sglang\n"
        "from hisparse_plan.errors import PlanError\n"
        "args = types.SimpleNamespace(model_path=sys.argv[1], tp_size=1)\n"
        "try:\n"
        "    request_from_sglang(args, {'available_bytes': 2**30})\n"
        "except PlanError as error:\n"
        "    print('refused:', error)\n"
        "except BaseException as error:\n"
        "    print('escaped:', type(error).__name__)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", script, str(model)], capture_output=True,
                          text=True, env=env, timeout=300, check=False)
    assert done.stdout.startswith("refused:"), (done.stdout, done.stderr[-2000:])
    assert "a character device; expected a regular file" in done.stdout


# -- adapter arguments of the wrong kind --------------------------------------------------------


def untyped(value: object) -> Any:
    """`value`, as an untyped caller would pass it."""
    return value


@pytest.mark.parametrize(("call", "fragment"), [
    (lambda: hisparse_settings("[" * 5000 + "]" * 5000), "hisparse_config: Invalid JSON"),
    (lambda: hisparse_settings('{"top_k": 1, "top_k": 2}'), "hisparse_config.top_k: duplicate"),
    (lambda: request_from_sglang(_sglang(CONFIGS / "deepseek-v3.2-exp", enable_hisparse=True,
                                         hisparse_config="{"), MEMORY),
     "hisparse_config: Invalid JSON"),
    (lambda: settings_from_server_args(untyped(["tp_size", 1])),
     "server_args: expected a mapping"),
    (lambda: settings_from_server_args(SERVER_ARGS, MEMORY, gpu=untyped("h200")),
     "gpu: expected a mapping"),
    (lambda: request_from_server_args(DSA, untyped(json.dumps(SERVER_ARGS)), MEMORY),
     "server_args: expected a mapping"),
    (lambda: request_from_server_args(DSA, SERVER_ARGS, untyped(None)),
     "memory: expected a mapping"),
    (lambda: request_from_server_args(DSA, SERVER_ARGS, {"available_bytes": "8GiB"}),
     "memory.available_bytes: expected a byte count"),
    (lambda: request_from_server_args(untyped(5), SERVER_ARGS, MEMORY),
     "config: expected a config.json dict or a path"),
    (lambda: request_from_server_args("model\0/config.json", SERVER_ARGS, MEMORY),
     "embedded null byte"),
    (lambda: request_from_server_args(
        {**WRAPPER, "text_config": LLAMA}, SERVER_ARGS, MEMORY), "text_config"),
    (lambda: request_from_sglang(SimpleNamespace(model_path="m\0", tp_size=1), MEMORY),
     "embedded null byte"),
], ids=["deep-hisparse-config", "duplicate-hisparse-config", "bad-hisparse-config",
        "server-args-list", "gpu-str", "server-args-json-text", "memory-none",
        "available-bytes-str", "config-int", "config-nul", "config-llama-text-config",
        "model-path-nul"])
def test_adapter_arguments_of_the_wrong_kind_are_plan_errors(
    call: Callable[[], object], fragment: str
) -> None:
    error = _raised(call)
    assert isinstance(error, PlanError), repr(error)
    assert fragment in str(error)


def test_plan_json_text_with_a_key_twice_is_refused() -> None:
    plan = hisparse_plan.plan(json.loads((CONFIGS.parent / "golden" /
                                          "deepseek_v32_fp8.request.json").read_text()))
    text = plan.model_dump_json()
    assert load_plan(text) == plan
    first = next(iter(json.loads(text)))
    with pytest.raises(PlanError, match=f"{first}: duplicate key '{first}'"):
        load_plan(f'{{"{first}": null, ' + text[1:])


def test_a_weight_index_that_is_no_regular_file_is_refused(tmp_path: Path) -> None:
    """It was skipped silently (as if there were none) when it was not a regular file."""
    (tmp_path / INDEX_FILE).symlink_to("/dev/null")
    with pytest.raises(ConfigError, match="a character device; expected a regular file"):
        index_weights(tmp_path / "config.json")


# -- one reader: no other code in src/ reads a file or parses JSON ------------------------------

READS = re.compile(r"\bjson\.loads?\(|\.read_text\(|\.read_bytes\(|\bfrom_json\(|[^.\w]open\(")
ALLOWED = {
    "models/json_input.py": "the strict parser that untrusted_json and request text share",
    "presets/catalog.py": "the package's own preset data",
    "cli/commands/docs.py": "the package's own docs",
}
"""Modules that may read a file or parse JSON themselves, and why (untrusted_json opens files
with os.open; torch/ reads /proc and /sys, and opens its own shared-memory files)."""


def test_every_file_and_json_reader_goes_through_one_module() -> None:
    root = Path(hisparse_plan.__file__).parent
    readers = sorted(
        str(path.relative_to(root)) for path in root.rglob("*.py")
        if READS.search(path.read_text()) and path.relative_to(root).parts[0] != "torch"
    )
    assert set(readers) <= set(ALLOWED), sorted(set(readers) - set(ALLOWED))


# -- the reader itself ------------------------------------------------------------------------


def _empty(info: os.stat_result) -> os.stat_result:
    """`info` with a size of 0 bytes."""
    fields = list(info)
    fields[stat.ST_SIZE] = 0
    return os.stat_result(fields)


def test_the_size_bound_is_exact_and_holds_for_a_file_that_grows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hisparse_plan.models import untrusted_json

    path = write(tmp_path / "a.json", '{"a": 1}')
    assert untrusted_json.read_json_file(path, what="x", max_bytes=8) == {"a": 1}
    with pytest.raises(PlanError, match=r"a\.json: expected at most 7 bytes, got 8 bytes"):
        untrusted_json.read_json_file(path, what="x", max_bytes=7)
    # A file that grows after stat and fstat: one byte past the bound is read, and refused.
    real_stat, real_fstat = os.stat, os.fstat
    monkeypatch.setattr(os, "stat", lambda p: _empty(real_stat(p)))
    monkeypatch.setattr(os, "fstat", lambda fd: _empty(real_fstat(fd)))
    with pytest.raises(PlanError, match="expected at most 7 bytes, got more than that"):
        untrusted_json.read_json_file(path, what="x", max_bytes=7)


def test_a_request_file_must_be_utf8(cli: Run, tmp_path: Path) -> None:
    request = (CONFIGS.parent / "golden" / "deepseek_v32_fp8.request.json").read_text()
    path = write(tmp_path / "request.json", request.encode("utf-16"))
    line = one_error(*cli("plan", "--request", str(path)))
    assert "byte 0xff at offset 0 is not UTF-8" in line
