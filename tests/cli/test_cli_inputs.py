"""No argument list reaches the command's "internal error, please report it": every flag at its
extremes, --hisparse-config of any shape, unknown engines, one engine's flags given to the
other, and config.json files whose fields have the wrong type or size. The command is run
in-process; each answer is a result (exit 0) or a refusal (exit 2) in one `error:` line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support import paths
from support.cli_support import Run

HF_CONFIGS = paths.HF_CONFIGS
INT64_MAX = 2**63 - 1
MODELS = ["llama-3-8b", "glm-5", "deepseek-v3.2", "gemma-3-27b", "gpt-oss-120b",
          "qwen3-next-80b", "llama-4-scout", "deepseek-v4-flash"]
COMMON = ["--gpu-mem", "--max-model-len", "-tp", "--kv-cache-memory-bytes", "-dp",
          "--num-speculative-tokens"]
VLLM = ["--host-pool", "--spec-tokens", "--device-buffer", "--block-size", "--max-num-seqs",
        "--max-num-batched-tokens", "--max-concurrent-batches", "--num-gpu-blocks-override",
        "-pp", "--stage-gpu-mem", "-dcp"]
SGLANG = ["--page-size", "--mem-fraction-static", "--max-running-requests", "--context-length",
          "--max-total-tokens", "--swa-full-tokens-ratio", "--max-mamba-cache-size"]
WITH_GPU = ["--gpu-memory-utilization", "--activation-reserve", "--weights-bytes",
            "--parameters"]
VALUES = [str(INT64_MAX), str(INT64_MAX + 1), str(2**62), "-1", "0", "1", "nan", "inf", "-inf",
          "", " ", "1e308", "1" * 30, "1e-300", "0.9999999999999999", "64", "9EiB", "1,2"]
PLAUSIBLE = ["2", "8", "64", "4096", "131072", "0.5", "0.9", "60GiB", "1TiB"]
"""Values most flags take, so that the extremes meet the planners, not only the parser."""
HISPARSE_CONFIGS = [
    "null", "[]", "1", '"x"', "{}", "{", "", '{"top_k": 0}', '{"top_k": 1e400}',
    f'{{"top_k": {INT64_MAX}}}', f'{{"top_k": {2**62}}}', f'{{"device_buffer_size": {INT64_MAX}}}',
    f'{{"host_to_device_ratio": {INT64_MAX}}}', '{"top_k": {"a": 1}}', '{"top_k": "2048"}',
    '{"top_k": NaN}', "[" * 50_000 + "]" * 50_000, '{"top_k": 1' + "0" * 5000 + "}",
    '{"top_k": 2048, "top_k": 4096}', '{"unknown": 1}',
]
ENGINES = ["vllm", "sglang", "vllm,sglang", "sglang,vllm", "", "foo", ",", "SGLANG"]


def answered(code: int, out: str, err: str) -> None:
    """A result, or one refusal that is not an internal error."""
    assert "internal error" not in err, err
    assert "Traceback" not in err, err
    assert code in (0, 2), err
    if code == 2:
        assert out == ""
        assert err.splitlines()[-1].startswith("error: "), err


@st.composite
def argument_lists(draw: st.DrawFn) -> list[str]:
    command = draw(st.sampled_from(["plan", "capacity"]))
    argv = [command, draw(st.sampled_from(MODELS)), "--json"]
    engine = draw(st.sampled_from(["vllm", "sglang"] * 4 + ENGINES))
    argv += ["--engine", engine]
    flags = COMMON + WITH_GPU + (SGLANG if "sglang" in engine else VLLM)
    for flag in draw(st.lists(st.sampled_from(flags), min_size=1, max_size=2, unique=True)):
        argv += [flag, draw(st.sampled_from(VALUES + PLAUSIBLE * 3))]
    if draw(st.booleans()):
        argv += ["--gpu", "h200"]
    if "sglang" in engine and draw(st.booleans()):
        argv += ["--enable-hisparse", "--hisparse-config", draw(st.sampled_from(HISPARSE_CONFIGS))]
    return argv


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(argv=argument_lists())
def test_any_flags_are_a_result_or_a_refusal(cli: Run, argv: list[str]) -> None:
    answered(*cli(*argv))


@pytest.mark.parametrize("config", HISPARSE_CONFIGS)
def test_any_hisparse_config_is_a_result_or_a_refusal(cli: Run, config: str) -> None:
    answered(*cli("plan", "deepseek-v3.2", "--engine", "sglang", "--enable-hisparse",
                  "--hisparse-config", config, "--json"))


@pytest.mark.parametrize(("argv", "line"), [
    (["--gpu-mem", str(INT64_MAX)],
     "error: device.available_bytes: the KV budget in bytes would be 9223372036854775808, "
     "past int64"),
    (["--context-length", str(INT64_MAX), "--allow-long-context"],
     "error: engine.context_length: the request-to-token table's bytes"),
    (["--context-length", str(2**61), "--allow-long-context"],
     "error: engine.context_length: the request-to-token table's bytes"),
])
def test_sglang_extremes_name_the_setting(cli: Run, argv: list[str], line: str) -> None:
    """They were refused as a ValidationError about the plan's own models (shape[1],
    available_bytes), or planned with a request table of 2**74 bytes."""
    code, out, err = cli("plan", "llama-3-8b", "--engine", "sglang", *argv, "--json")
    answered(code, out, err)
    assert err.startswith(line), err


def test_sglang_hot_rows_past_int64_name_top_k(cli: Run) -> None:
    code, out, err = cli("plan", "deepseek-v3.2", "--engine", "sglang", "--enable-hisparse",
                         "--hisparse-config", f'{{"top_k": {2**62}}}', "--json")
    answered(code, out, err)
    assert err.startswith("error: engine.hisparse_top_k: a request's hot rows"), err


def _config(name: str, tmp_path: Path, **edits: Any) -> str:
    config = json.loads((HF_CONFIGS / name / "config.json").read_text())
    for key, value in edits.items():
        config[key] = value(config) if callable(value) else value
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return str(path)


@pytest.mark.parametrize(("name", "edits", "fragment"), [
    ("gemma-2-9b-it", {"text_config": lambda config: dict(config)},
     "text_config: transformers' Gemma2Config reads no text sub-config"),
    ("deepseek-v3.2-exp", {"model_type": ["deepseek_v32"]},
     "model_type: expected a name such as 'llama', got list"),
    ("deepseek-v3.2-exp", {"model_type": {}}, "model_type: expected a name"),
    ("ai21-jamba-mini-1.6", {"num_attention_heads": 8192},
     "num_attention_heads: without head_dim a head is hidden_size / num_attention_heads wide; "
     "expected at most hidden_size (4096) heads, got 8192"),
])
@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_config_fields_of_the_wrong_type_are_refused_by_name(
    cli: Run, tmp_path: Path, name: str, edits: dict[str, Any], fragment: str, engine: str
) -> None:
    """Each reached the internal error (AttributeError, TypeError, ZeroDivisionError). SGLang
    reads the config its own way first (targets/sglang/served/hf_config.py): a model_type that is
    not a string, or an architecture its registry lacks (Jamba), is refused there by name."""
    code, out, err = cli("plan", "--hf-config", _config(name, tmp_path, **edits),
                         "--engine", engine, "--json")
    answered(code, out, err)
    assert code == 2
    if engine == "sglang" and "model_type" in edits:
        fragment = "model_type: SGLang loads config.json through transformers' AutoConfig"
    if engine == "sglang" and name == "ai21-jamba-mini-1.6":
        fragment = "architectures[0]: SGLang 0.5.23's model registry has no 'JambaForCausalLM'"
    assert fragment in err, err
