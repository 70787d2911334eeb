"""`--specs-from-vllm`: a config.json is planned only when vLLM's own model class, built on the
meta device, gives the same cache layers as the config reading.

Where vLLM is absent (CI) the flag is refused naming what it needs. Where it is installed, each
case runs the CLI in a fresh process (vLLM's platform and parallel groups are per process).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support import paths
from support.cli_support import Run

CONFIGS = paths.HF_CONFIGS
HAS_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed here")


@pytest.mark.parametrize("command", [["plan"], ["capacity", "--compare"]])
def test_a_preset_is_refused_since_vllm_builds_from_a_config_json(
    cli: Run, command: list[str],
) -> None:
    code, _, err = cli(*command, "llama-3-8b", "--specs-from-vllm")
    assert code == 2
    assert "--specs-from-vllm: expected --hf-config FILE" in err


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed here")
def test_without_vllm_the_flag_says_what_it_needs(cli: Run) -> None:
    config = CONFIGS / "qwen2.5-7b-instruct" / "config.json"
    code, out, err = cli("plan", "--hf-config", str(config), "--specs-from-vllm")
    assert (code, out) == (2, "")
    assert "needs vLLM installed" in err


def _cli(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "ERROR", "HF_HUB_OFFLINE": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "hisparse_plan.cli", *argv], env=env,
                          capture_output=True, text=True, timeout=600, check=False)


@needs_vllm
@pytest.mark.parametrize(("model", "tp"), [
    ("gemma-3-1b-it", "1"),                # sliding windows in a pattern, from layer_types
    ("qwen3-next-80b-a3b-instruct", "4"),  # linear-attention (Mamba) hybrid, states per rank
    ("gpt-oss-20b", "2"),                  # alternating sliding and full attention
    ("deepseek-v3", "8"),                  # plain MLA
])
def test_the_plan_is_the_config_readings_when_vllm_builds_the_same_layers(
    model: str, tp: str,
) -> None:
    argv = ["plan", "--hf-config", str(CONFIGS / model / "config.json"), "-tp", tp,
            "--max-model-len", "8192", "--json"]
    checked, plain = _cli(*argv, "--specs-from-vllm"), _cli(*argv)
    assert checked.returncode == 0, checked.stderr[-2000:]
    assert json.loads(checked.stdout) == json.loads(plain.stdout)


@needs_vllm
@pytest.mark.parametrize(("model", "tp"), [
    ("kimi-linear-48b-a3b-instruct", "4"),  # KDA states beside MLA (inert CUDA streams on CPU)
    ("lfm2-1.2b", "2"),                     # short-convolution states
    ("granite-4.0-h-small", "8"),           # Mamba-2 hybrid, groups replicated over ranks
    ("command-a-03-2025", "8"),             # Cohere's window + 1
    ("exaone-4.0-32b", "8"),                # a window pattern transformers writes out
    ("glm-4.7-flash", "4"),                 # MLA
    ("minimax-m2", "8"),                    # attn_type_list all full attention
])
def test_issue_27_families_plan_as_vllm_builds_them(model: str, tp: str) -> None:
    """Qwen3.5 is left out here: its multimodal wrapper imports torchvision, which a CPU-only
    venv may lack (references/vllm_family_sweep.py stands it in and checks it)."""
    argv = ["plan", "--hf-config", str(CONFIGS / model / "config.json"), "-tp", tp,
            "--max-model-len", "4096", "--json"]
    checked, plain = _cli(*argv, "--specs-from-vllm"), _cli(*argv)
    assert checked.returncode == 0, checked.stderr[-2000:]
    assert json.loads(checked.stdout) == json.loads(plain.stdout)


HAS_TIMM = importlib.util.find_spec("timm") is not None
REFERENCES = paths.REPO / "references"


@needs_vllm
@pytest.mark.skipif(not HAS_TIMM, reason="vLLM's Gemma3nForConditionalGeneration builds timm's "
                    "vision tower, and timm is not importable here")
def test_gemma3n_plans_as_vllm_allocates_it(tmp_path: Path) -> None:
    """20 of 35 layers allocate (vLLM gives the 15 that read layers 18 and 19's caches no
    spec); the meta build's sharing targets must be the reading's. timm imports torchvision,
    which no cache layer needs: references/vllm_hf_layers.py's stand-in takes its place (a
    CPU-only torch has no torchvision that loads beside it)."""
    sys.path.insert(0, str(REFERENCES))
    try:
        from vllm_hf_layers import STUBS
    finally:
        sys.path.remove(str(REFERENCES))
    (tmp_path / "sitecustomize.py").write_text(STUBS)
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    argv = ["plan", "--hf-config", str(CONFIGS / "gemma-3n-e4b-it" / "config.json"),
            "--max-model-len", "4096", "--json"]
    checked, plain = _cli(*argv, "--specs-from-vllm", env=env), _cli(*argv, env=env)
    assert checked.returncode == 0, checked.stderr[-2000:]
    plan = json.loads(checked.stdout)
    assert plan == json.loads(plain.stdout)
    assert sum(len(group["layer_names"]) for group in plan["groups"]) == 20
    assert len(plan["kv_sharing"]) == 15


@needs_vllm
def test_a_deployment_comparison_checks_the_layers_once() -> None:
    argv = ["capacity", "--hf-config", str(CONFIGS / "gemma-3-1b-it" / "config.json"),
            "--compare", "--gpu-mem", "20GiB", "--json"]
    checked, plain = _cli(*argv, "--specs-from-vllm"), _cli(*argv)
    assert checked.returncode == 0, checked.stderr[-2000:]
    ours, theirs = json.loads(checked.stdout), json.loads(plain.stdout)
    assert ours["results"] == theirs["results"]
    assert "as vLLM 0.3" in ours["model"]


PROBE = """
import json, sys
from pathlib import Path
from hisparse_plan.adapters.vllm.meta_model import check_layers_agree, kv_cache_specs
from hisparse_plan.errors import UnsupportedRequestError
from hisparse_plan.presets import Settings, build_request, load_config_file

path = Path(sys.argv[1])
request = build_request(load_config_file(path), Settings(max_model_len=4096))
meta = kv_cache_specs(json.loads(path.read_text()), max_model_len=4096)
check_layers_agree(request.layers, meta)
layers = request.model_dump(mode="json")["layers"]
name = sys.argv[2]
layers[name]["sliding_window"] = layers[name]["sliding_window"] * 2
wrong = type(request).model_validate({**request.model_dump(mode="json"), "layers": layers})
try:
    check_layers_agree(wrong.layers, meta)
except UnsupportedRequestError as error:
    print("REFUSED", error.field, error)
"""


@needs_vllm
def test_a_layer_the_reading_gets_wrong_is_refused_naming_it() -> None:
    config = CONFIGS / "gemma-3-1b-it" / "config.json"
    name = "model.layers.0.self_attn.attn"
    done = subprocess.run([sys.executable, "-c", PROBE, str(config), name], capture_output=True,
                          text=True, timeout=600, check=False,
                          env={**os.environ, "VLLM_LOGGING_LEVEL": "ERROR"})
    assert done.returncode == 0, done.stderr[-2000:]
    refused = done.stdout.strip().splitlines()[-1]
    assert refused.startswith(f"REFUSED layers[{name!r}].sliding_window")
    assert "vLLM 0.3" in refused
    assert "Gemma3ForCausalLM" in refused
