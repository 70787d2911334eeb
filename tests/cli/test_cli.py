"""The `hisparse-plan` command, in process: every subcommand, JSON back into the models, and
every refusal as one line with exit code 2."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
from pydantic import TypeAdapter

import hisparse_plan as hp
from hisparse_plan.operator import (
    BestTune,
    CapacityComparison,
    Explanation,
    HostPoolTune,
    Sweep,
    TuneResult,
)
from support.cli_support import Run
from support.golden import GOLDEN, load, project

GIB = 2**30
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def refused(code: int, out: str, err: str, *fragments: str) -> None:
    """One `error:` line on stderr, nothing on stdout, exit code 2."""
    assert code == 2, err
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ")
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0]


# -- plan ----------------------------------------------------------------------------------------


def test_plan_summary(cli: Run, renderer: str) -> None:
    code, out, err = cli("plan", "deepseek-v3.2")
    assert (code, err) == (0, "")
    assert out.startswith("DeepSeek-V3.2: fp8_ds_mla, block 64, max_model_len 163840, BLHNC")
    for number in ("26832", "2561024", "118038", "545792", "2560", "3712", "2956", "10.48",
                   "31.80", "39.68", "12+12+12+12+12+1"):
        assert number in out
    assert "binds: the host pool" in out


GOLDEN_FLAGS = {
    "deepseek_v32_fp8": ["deepseek-v3.2"],
    "glm5_fp8_blhnc": ["glm-5", "--gpu-mem", "90GiB", "--host-pool", "256GiB",
                       "--device-buffer", "6144", "--layout", "blhnc",
                       "--max-num-batched-tokens", "16384"],
    "index_share_every_4": ["glm-5-index-share-4", "--max-model-len", "128k",
                            "--host-pool", "128G", "--gpu-mem", "40GiB"],
    "deepseek_v32_fp8_mtp3_shared_pool": ["deepseek-v3.2", "--tp", "8", "--spec-tokens", "3",
                                          "--gpu-mem", "100GiB", "--host-pool", "0.5TiB"],
}


@pytest.mark.parametrize("case", sorted(GOLDEN_FLAGS))
def test_plan_json_is_the_golden_plan(cli: Run, case: str) -> None:
    code, out, err = cli("plan", *GOLDEN_FLAGS[case], "--json")
    assert (code, err) == (0, "")
    plan = hp.KVCachePlan.model_validate_json(out)
    assert project(plan.model_dump(mode="json")) == load(case)[1]


def test_plan_request_file_and_overrides(cli: Run) -> None:
    path = str(GOLDEN / "deepseek_v32_fp8.request.json")
    code, out, _ = cli("plan", "--request", path, "--json")
    assert code == 0
    assert project(json.loads(out)) == load("deepseek_v32_fp8")[1]
    code, out, _ = cli("plan", "--request", path, "--gpu-mem", "30GiB", "--json")
    assert code == 0
    plan = hp.KVCachePlan.model_validate_json(out)
    assert plan.device_pool.available_bytes == 30 * GIB
    assert plan.num_blocks == 30 * GIB // 545792


def test_plan_request_from_stdin(cli: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    raw = (GOLDEN / "deepseek_v32_fp8.request.json").read_bytes()
    monkeypatch.setattr(sys, "stdin", types.SimpleNamespace(buffer=io.BytesIO(raw)))
    code, out, _ = cli("plan", "--request", "-", "--json")
    assert code == 0
    assert project(json.loads(out)) == load("deepseek_v32_fp8")[1]


def test_plan_hf_config(cli: Run, tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({
        "model_type": "glm_moe_dsa", "num_hidden_layers": 78, "kv_lora_rank": 512,
        "qk_rope_head_dim": 64, "index_head_dim": 128, "index_topk": 2048,
        "max_position_embeddings": 202752, "hidden_size": 6144,
    }))
    flags = GOLDEN_FLAGS["glm5_fp8_blhnc"][1:]
    code, out, err = cli("plan", "--hf-config", str(config), *flags, "--json")
    assert (code, err) == (0, "")
    assert project(json.loads(out)) == load("glm5_fp8_blhnc")[1]
    code, out, _ = cli("plan", "--hf-config", str(config), "--kv-dtype", "bfloat16", "--plain")
    assert code == 0
    assert f"{config} (glm_moe_dsa): bfloat16, block 64" in out


@pytest.mark.parametrize(("argv", "fragments"), [
    (["plan"], ["expected exactly one of MODEL, --request FILE or --hf-config FILE, got none"]),
    (["plan", "glm-5", "--request", "x.json"], ["got MODEL and --request"]),
    (["plan", "llama-3"], ["unknown model 'llama-3'", "deepseek-v3.2"]),
    (["plan", "glm-5", "--gpu-mem", "60XB"], ["argument --gpu-mem: invalid size '60XB'"]),
    (["plan", "glm-5", "--host-pool", "0"], ["argument --host-pool: expected a size above 0"]),
    (["plan", "glm-5", "--tp", "0"],
     ["argument -tp/--tensor-parallel-size/--tp: expected at least 1"]),
    (["plan", "glm-5", "--spec-tokens", "two"], ["argument --spec-tokens: invalid count"]),
    (["plan", "glm-5", "--max-model-len", "12.5k"], ["argument --max-model-len"]),
    (["plan", "glm-5", "--layout", "XYZ"], ["argument --layout: invalid choice"]),
    (["plan", "glm-5", "--host-pool", "1GiB"], ["hisparse.host_pool_gib", "raise host_pool_gib"]),
    (["plan", "glm-5", "--device-buffer", "100"], ["device_buffer_size", "at least 2048"]),
    (["plan", "--request", "missing.json"], ["missing.json: No such file or directory"]),
    (["plan", "--request", str(GOLDEN / "deepseek_v32_fp8.request.json"), "--kv-dtype",
      "bfloat16"], ["kv_dtype shapes the layers"]),
    (["plan", "--hf-config", str(GOLDEN / "deepseek_v32_fp8.request.json")],
     ["num_hidden_layers: missing"]),
    (["frobnicate"], ["invalid choice: 'frobnicate'"]),
    (["plan", "glm-5", "--bogus"], ["unrecognized arguments: --bogus"]),
])
def test_refusals_are_one_line(cli: Run, argv: list[str], fragments: list[str]) -> None:
    refused(*cli(*argv), *fragments)


def test_bad_request_files(cli: Run, tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    refused(*cli("plan", "--request", str(broken)), "Invalid JSON", "line 1 column 2")
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"layers": {}, "model": {}, "device": {}}))
    refused(*cli("plan", "--request", str(wrong)), "layers")


def test_warnings_are_one_line_each_and_once(cli: Run) -> None:
    code, _, err = cli("capacity", "deepseek-v3.2", "--device-buffer", "4100", "--sweep",
                       "max-model-len", "--points", "64k,128k")
    assert code == 0
    assert err.splitlines() == [
        "warning: hisparse.device_buffer_size 4100 is not a multiple of block_size 64: the "
        "last hot block of every request leaves 60 rows unused"
    ]


# -- capacity ----------------------------------------------------------------------------------


ACCEPTANCE = ["capacity", "deepseek-v3.2", "--gpu-mem", "60GiB", "--host-pool", "64GiB",
              "--max-model-len", "163840"]


def test_capacity_prints_both_and_the_ratio(cli: Run, renderer: str) -> None:
    code, out, err = cli(*ACCEPTANCE)
    assert (code, err) == (0, "")
    # By hand: HiSparse is host-bound, 64 GiB // (61 * 41984) = 26832 blocks / 2560 a request;
    # the baseline has 60 GiB // (2561024 + 515328) = 20941 blocks / 2560 a request.
    hisparse, baseline = 26832 / 2560, 20941 / 2560
    assert f"{hisparse:.2f}" == "10.48"
    assert f"{baseline:.2f}" == "8.18"
    row = next(line for line in out.splitlines() if "HiSparse " in line and "10.48" in line)
    assert row.split()[-2:] == ["10.48", "10.48"]
    baseline_row = next(line for line in out.splitlines() if "all-GPU baseline" in line)
    assert "8.18" in baseline_row
    assert f"ratio (HiSparse / baseline): {hisparse / baseline:.2f}x" in out
    assert "1.28x" in out
    assert "HiSparse binds on: host pool" in out


def test_capacity_json(cli: Run) -> None:
    code, out, _ = cli(*ACCEPTANCE, "--json")
    assert code == 0
    data = json.loads(out)
    assert data["hisparse"] == {"max_concurrency": 10.48125, "steady_state_concurrency": 10.48125}
    assert data["baseline"]["max_concurrency"] == 20941 / 2560
    assert data["ratio"] == pytest.approx((26832 / 2560) / (20941 / 2560))
    assert CapacityComparison.model_validate_json(out).binding == "host"


def test_capacity_sweeps(cli: Run, renderer: str) -> None:
    code, out, _ = cli("capacity", "deepseek-v3.2", "--sweep", "host-pool")
    assert code == 0
    assert "DeepSeek-V3.2: 60 GiB GPU, max_model_len 163840" in out
    lines = out.splitlines()
    row = next(line for line in lines if line.split()[:2] == ["64", "GiB"])
    assert row.split()[2:] == ["10.48", "10.48", "8.18", "1.28x", "host", "pool"]
    row = next(line for line in lines if line.split()[:2] == ["1", "TiB"])
    assert row.split()[2:] == ["31.80", "39.68", "8.18", "3.89x", "GPU"]
    code, out, _ = cli("capacity", "deepseek-v3.2", "--sweep", "max-model-len", "--points",
                       "4096,16k,4m", "--allow-long-context")
    assert code == 0
    assert "refused at 4194304: hisparse.host_pool_gib" in out


def test_capacity_sweep_json(cli: Run) -> None:
    code, out, _ = cli("capacity", "glm-5", "--sweep", "max-model-len", "--json")
    assert code == 0
    result = Sweep.model_validate_json(out)
    assert [p.value for p in result.points] == [
        4096, 8192, 16384, 32768, 65536, 131072, 202752]
    assert all(p.comparison is not None for p in result.points)


def test_plot_writes_a_png(cli: Run, tmp_path: Path) -> None:
    image = pytest.importorskip("matplotlib.image")
    path = tmp_path / "sweep.png"
    code, out, _ = cli("capacity", "deepseek-v3.2", "--sweep", "host-pool", "--plot", str(path))
    assert code == 0
    assert f"plot: {path}" in out
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC)
    assert 10_000 < len(data) < 500_000
    pixels = image.imread(str(path))
    assert pixels.shape[:2] == (400, 700)


def test_plot_without_matplotlib(cli: Run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for module in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, module, None)  # None makes `import` fail
    path = tmp_path / "sweep.png"
    refused(*cli("capacity", "glm-5", "--sweep", "host-pool", "--plot", str(path)),
            "--plot needs matplotlib: pip install 'hisparse-plan[plot]'")
    assert not path.exists()


@pytest.mark.parametrize(("argv", "fragment"), [
    (["--plot", "x.png"], "--plot needs --sweep"),
    (["--points", "8k"], "--points needs --sweep"),
    (["--sweep", "max-model-len", "--points", "8k,lots"], "--points: invalid token count"),
    (["--sweep", "host-pool", "--points", "0"], "--points: expected values above 0"),
    (["--sweep", "context"], "argument --sweep: invalid choice"),
])
def test_capacity_refusals(cli: Run, argv: list[str], fragment: str) -> None:
    refused(*cli("capacity", "glm-5", *argv), fragment)


# -- tune ----------------------------------------------------------------------------------------


def test_tune_target(cli: Run, renderer: str) -> None:
    code, out, err = cli("tune", "deepseek-v3.2", "--target", "20")
    assert (code, err) == (0, "")
    assert f"= {20 * 2560 * 2561024} bytes ({20 * 2560} blocks of 2561024 bytes)" in out
    assert "122.119140625 (exact)" in out
    assert "the host pool" in out
    assert f"{(20 * 2560 - 1) / 2560:.4f}, short of 20" in out


def test_tune_json_replans(cli: Run) -> None:
    code, out, _ = cli("tune", "glm-5", "--target", "12.5", "--metric", "steady", "--json")
    assert code == 0
    answer = TypeAdapter(TuneResult).validate_json(out)
    assert isinstance(answer, HostPoolTune)
    _, at, _ = cli("plan", "glm-5", "--host-pool", str(answer.host_pool_bytes), "--json")
    _, below, _ = cli("plan", "glm-5", "--host-pool", str(answer.host_pool_bytes - 1), "--json")
    steady_at = hp.KVCachePlan.model_validate_json(at).capacity.steady_state_concurrency
    steady_below = hp.KVCachePlan.model_validate_json(below).capacity.steady_state_concurrency
    assert steady_at is not None
    assert steady_below is not None
    assert steady_at >= 12.5 > steady_below


def test_tune_dram(cli: Run, renderer: str) -> None:
    code, out, _ = cli("tune", "deepseek-v3.2", "--dram", "512GiB")
    assert code == 0
    assert "31.80 max, 39.68 steady state" in out
    assert "the GPU" in out
    code, out, _ = cli("tune", "deepseek-v3.2", "--dram", "512GiB", "--json")
    best = TypeAdapter(TuneResult).validate_json(out)
    assert isinstance(best, BestTune)
    assert best.spare_dram_bytes == 512 * GIB - best.host_pool_bytes > 0


@pytest.mark.parametrize(("argv", "fragment"), [
    (["--target", "40"], "the GPU binds"),
    ([], "one of the arguments --target --dram is required"),
    (["--target", "5", "--dram", "1TiB"], "not allowed with argument"),
    (["--target", "0"], "argument --target: expected a target above 0"),
    (["--target", "5", "--host-pool", "64GiB"], "unrecognized arguments: --host-pool"),
])
def test_tune_refusals(cli: Run, argv: list[str], fragment: str) -> None:
    refused(*cli("tune", "deepseek-v3.2", *argv), fragment)


# -- explain, schema, models ----------------------------------------------------------------------


def test_explain(cli: Run, renderer: str) -> None:
    code, out, _ = cli("explain", "deepseek-v3.2")
    assert code == 0
    for fragment in ("model config (config.json fields)", "kv_lora_rank=512", "656",
                     "host_pool.num_blocks", "budget", "26832",
                     "tensors[13].block_stride", "capacity.max_concurrency", "10.48125"):
        assert fragment in out


def test_explain_json_and_sections(cli: Run) -> None:
    code, out, _ = cli("explain", "--request", str(GOLDEN / "glm5_fp8_blhnc.request.json"),
                       "--json")
    assert code == 0
    explanation = Explanation.model_validate_json(out)
    plan = hp.plan(hp.PlanRequest.model_validate(load("glm5_fp8_blhnc")[0]))
    assert explanation.step("num_blocks").value == plan.num_blocks
    assert not any(s.title.startswith("model config") for s in explanation.sections)
    code, out, _ = cli("explain", "glm-5", "--section", "HOST", "--json")
    assert [s.title for s in Explanation.model_validate_json(out).sections] == [
        "pools: host and device (see docs/planning-rules.md#host-pool, #device-pool, "
        "#pipeline-stages)"]
    refused(*cli("explain", "glm-5", "--section", "nothing"),
            "--section 'nothing' matches no section; expected a word from one of: backends and "
            "layout, model config, pages, groups, pools: host and device, admission, tensors, "
            "capacity")


def test_schema(cli: Run) -> None:
    code, out, _ = cli("schema")
    assert code == 0
    schemas = json.loads(out)
    draft = {"$schema": "https://json-schema.org/draft/2020-12/schema"}
    assert schemas == {
        "request": draft | hp.PlanRequest.model_json_schema(),
        "plan": draft | hp.KVCachePlan.model_json_schema(mode="serialization"),
        "sglang-plan": draft | hp.SGLangPlan.model_json_schema(mode="serialization"),
    }
    code, out, _ = cli("schema", "sglang-plan")
    assert json.loads(out)["title"] == "SGLangPlan"
    code, out, _ = cli("schema", "request", "--json")
    assert json.loads(out)["title"] == "PlanRequest"


def test_models(cli: Run, renderer: str) -> None:
    code, out, _ = cli("models")
    assert code == 0
    for name in ("deepseek-v3.2", "glm-5", "glm-5.1", "glm-5-index-share-4"):
        assert name in out
    code, out, _ = cli("models", "--json")
    data = json.loads(out)
    assert data["deepseek-v3.2"]["config"]["num_hidden_layers"] == 61
    assert data["glm-5-index-share-4"]["config"]["index_topk_freq"] == 4


def test_help_documents_units_and_tp(cli: Run) -> None:
    code, out, _ = cli("plan", "--help")
    assert code == 0
    flat = " ".join(out.split())
    assert "K, M, G, T (also KiB, MiB, GiB, TiB) are powers of 1024" in flat
    assert "KB, MB, GB, TB are powers of 1000" in flat
    assert "--host-pool is that node-wide pool" in flat
    assert cli("--version")[0] == 0


# -- the installed console script --------------------------------------------------------------


def test_console_script() -> None:
    script = shutil.which("hisparse-plan", path=str(Path(sys.executable).parent))
    command = [script] if script else [sys.executable, "-m", "hisparse_plan.cli"]
    done = subprocess.run(
        [*command, *ACCEPTANCE, "--json"], capture_output=True, text=True, check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert CapacityComparison.model_validate_json(done.stdout).ratio == pytest.approx(
        26832 / 20941)
    bad = subprocess.run(
        [*command, "capacity", "deepseek-v3.2", "--gpu-mem", "lots"],
        capture_output=True, text=True, check=False, timeout=120,
    )
    assert bad.returncode == 2
    assert bad.stdout == ""
    assert bad.stderr.startswith("error: argument --gpu-mem: invalid size 'lots'")
    assert len(bad.stderr.splitlines()) == 1


def test_a_host_pool_sweep_refuses_a_fixed_host_pool(cli: Run) -> None:
    code, out, err = cli("capacity", "deepseek-v3.2", "--sweep", "host-pool",
                         "--host-pool", "64GiB")
    assert code == 2
    assert out == ""
    assert err.startswith("error: --host-pool cannot be combined with --sweep host-pool")
    assert err.count("\n") == 1
