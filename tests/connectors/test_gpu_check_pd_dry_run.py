"""benchmarks/gpu_check_pd.py's CPU dry run: the config read, both sides planned, the pair
compiled and proved, the connector's settings reader accepting each server's
kv-transfer-config, and the command lines printed; a refused config fails it (exit 1)."""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import sys
from pathlib import Path
from types import ModuleType

import pytest

from support import paths

ROOT = paths.REPO
CONFIG = ROOT / "tests" / "hf_configs" / "smollm3-small" / "config.json"


def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gpu_check_pd", ROOT / "benchmarks" / "gpu_check_pd.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check_pd"] = module
    spec.loader.exec_module(module)
    return module


def test_the_dry_run_plans_proves_and_prints_both_servers(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = script().main(["--dry-run", "--no-transformers", "--workdir", str(tmp_path),
                          "--prompts", "2"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "pattern compiled and proved" in out
    # A 128-token prompt (a whole number of blocks on both sides) moves every layer's K and
    # V of every KV head for each token: the config's own arithmetic.
    config = json.loads(CONFIG.read_text())
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    per_token = config["num_hidden_layers"] * 2 * config["num_key_value_heads"] * head_dim * 2
    assert f"a 128-token prompt moves {128 * per_token:,} bytes" in out
    lines = {line.split(":", 1)[0]: line.split(":", 1)[1] for line in out.splitlines()
             if line.startswith(("prefill:", "decode:", "baseline:", "proxy:"))}
    assert set(lines) == {"prefill", "decode", "baseline", "proxy"}
    words = {name: shlex.split(line) for name, line in lines.items()}
    for name, block in (("prefill", "16"), ("decode", "64"), ("baseline", "64")):
        command = words[name]
        assert command[command.index("--block-size") + 1] == block
        assert command[command.index("--load-format") + 1] == "dummy"
    for name in ("prefill", "decode"):
        command = words[name]
        found = json.loads(command[command.index("--kv-transfer-config") + 1])
        assert found["kv_connector"] == "HisparsePlanConnector"
        assert found["kv_connector_module_path"] == "hisparse_plan.connectors.vllm"
        assert found["kv_connector_extra_config"]["instance_id"] == name
    assert "--kv-transfer-config" not in words["baseline"]
    ports = {json.loads(words[n][words[n].index("--kv-transfer-config") + 1])
             ["kv_connector_extra_config"]["side_channel_port"] for n in ("prefill", "decode")}
    assert len(ports) == 2, "each instance needs its own side channel port"
    assert (tmp_path / "model" / "config.json").read_text() == CONFIG.read_text()
    assert re.search(r"--prefill http://127\.0\.0\.1:\d+ --decode http://127\.0\.0\.1:\d+",
                     lines["proxy"])


def test_the_dry_run_fails_on_a_config_the_project_refuses(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = json.loads(CONFIG.read_text())
    del config["num_hidden_layers"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    rc = script().main(["--dry-run", "--no-transformers", "--config", str(path),
                          "--workdir", str(tmp_path / "w")])
    out = capsys.readouterr().out
    assert rc == 1
    assert "FAIL" in out
    assert str(path) in out


def test_three_servers_cannot_each_take_half_the_gpu(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert script().main(["--dry-run", "--gpu-memory-utilization", "0.5"]) == 1
    assert "three servers" in capsys.readouterr().out
