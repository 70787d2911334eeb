"""vLLM's own KV-cache planning tests, stock and with hisparse_plan's builder plugged in.

    python references/vllm_own_tests.py /path/to/vllm-0.34.0 [--python VENV/bin/python]
        [--out report.json] [--tests tests/v1/core/test_kv_cache_planning.py ...]

SDIST is an unpacked vLLM source distribution of the installed version; its `tests/` run against
the installed vLLM (a temporary directory holds a `tests` link, so the sdist's own `vllm/` is not
on the path), on vLLM's CPU platform (VLLM_TARGET_DEVICE=cpu), offline (HF_HUB_OFFLINE=1).
Unless `--bare`, the machine is prepared the way a CPU test box with the Hub would be: a Hub
cache (HF_HOME in the temporary directory) holds the `config.json` of vLLM's default test model
(Qwen/Qwen3-0.6B; no weights, no tokenizer), and vLLM 0.34's CPU platform sees Triton while it
checks a config (see `vllm_probe_plugin`); without them most planning tests cannot build a
`VllmConfig` and fail stock, so they say nothing about a builder. The
run is made twice with `vllm_probe_plugin` loaded: stock, and with `install_builder()` applied
before every test (vLLM's platform hook answers our builder). It reports the tests passing stock,
passing with ours, every test that passes stock but not with ours (with its error), the tests
that call a KV cache config builder and whether each of those called ours, and apart from
those the tests that resolve a builder through vLLM's platform hook (a builder a test constructs
itself, e.g. `DefaultKVCacheConfigBuilder()`, is not one vLLM chose). The figures are
written to `--out` as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DEFAULT_TESTS = (
    "tests/v1/core/test_kv_cache_planning.py",
    "tests/v1/core/test_kv_cache_utils.py",
    "tests/v1/core/test_contiguous_kv_packing.py",
    "tests/v1/core/test_kv_cache_config_builder.py",
    "tests/v1/test_kv_cache_spec_registry.py",
    "tests/v1/attention/test_sparse_mla_kv_cache_layout.py",
)

Results = dict[str, dict[str, Any]]

DEFAULT_MODEL = "Qwen/Qwen3-0.6B"
DEFAULT_MODEL_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 1024,
    "intermediate_size": 3072, "num_attention_heads": 16, "num_key_value_heads": 8,
    "head_dim": 128, "num_hidden_layers": 28, "vocab_size": 151936,
    "max_position_embeddings": 40960, "rope_theta": 1000000, "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True, "torch_dtype": "bfloat16", "hidden_act": "silu",
    "attention_bias": False, "bos_token_id": 151643, "eos_token_id": 151645,
}
"""The public config.json of vLLM's default test model (ModelConfig() with no model)."""


def hub_cache(root: Path) -> Path:
    """A Hub cache holding the default test model's config, as a download would leave it."""
    repo = root / "hub" / f"models--{DEFAULT_MODEL.replace('/', '--')}"
    revision = "0" * 40
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    (snapshot / "config.json").write_text(json.dumps(DEFAULT_MODEL_CONFIG))
    return root


def run(python: str, tests: list[str], mode: str, workdir: Path, bare: bool) -> tuple[
    dict[str, Any], Results
]:
    """One pytest run of `tests` in `mode` ("stock" or "ours"): the header and each test."""
    out = workdir / f"{mode}.jsonl"
    env = dict(os.environ)
    if not bare:
        env["HF_HOME"] = str(workdir / "hf")
        env["HISPARSE_PROBE_TRITON"] = "1"
    env.update({
        "VLLM_TARGET_DEVICE": "cpu",
        "HF_HUB_OFFLINE": "1",
        "HISPARSE_PROBE_MODE": mode,
        "HISPARSE_PROBE_OUT": str(out),
        "PYTHONPATH": os.pathsep.join(
            [str(REPO / "src"), str(REPO / "references"), env.get("PYTHONPATH", "")]
        ),
    })
    command = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
               "vllm_probe_plugin", "--continue-on-collection-errors", *tests]
    completed = subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True,
                               check=False)
    if not out.exists():
        raise SystemExit(f"pytest wrote no results ({mode}):\n{completed.stdout[-3000:]}"
                         f"\n{completed.stderr[-3000:]}")
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    header, results = lines[0], {line["nodeid"]: line for line in lines[1:]}
    return header, results


def passing(results: Results) -> set[str]:
    return {nodeid for nodeid, entry in results.items() if entry["outcome"] == "passed"}


def compare(stock: Results, ours: Results) -> dict[str, Any]:
    stock_passed = passing(stock)
    ours_passed = passing(ours)
    lost = sorted(stock_passed - ours_passed)
    callers = {nodeid: entry["calls"] for nodeid, entry in ours.items()
               if any(entry["calls"].get(kind) for kind in ("ours", "default", "other"))}
    not_ours = {nodeid: calls for nodeid, calls in callers.items()
                if calls.get("default", 0) or calls.get("other", 0)}
    never_ours = sorted(nodeid for nodeid, calls in callers.items() if not calls.get("ours", 0))
    resolving = {nodeid: entry["calls"] for nodeid, entry in ours.items()
                 if entry["calls"].get("resolved_ours") or entry["calls"].get("resolved_other")}
    resolved_other = sorted(nodeid for nodeid, calls in resolving.items()
                            if calls.get("resolved_other"))
    return {
        "tests": len(stock),
        "passed_stock": len(stock_passed),
        "passed_ours": len(ours_passed),
        "passed_ours_only": sorted(ours_passed - stock_passed),
        "lost": [{"test": nodeid, "outcome": ours.get(nodeid, {}).get("outcome", "missing"),
                  "error": ours.get(nodeid, {}).get("error", "")} for nodeid in lost],
        "call_a_builder": len(callers),
        "call_ours_only": len(callers) - len(not_ours),
        "call_another_builder": not_ours,
        "never_call_ours": never_ours,
        "resolve_a_builder": len(resolving),
        "resolve_another_builder": resolved_other,
        "collection_errors": sorted(nodeid for nodeid, entry in stock.items()
                                    if entry["outcome"] == "collection_error"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sdist", type=Path)
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--tests", nargs="*", default=list(DEFAULT_TESTS))
    parser.add_argument("--bare", action="store_true",
                        help="no Hub cache for the default model, no Triton check satisfied")
    args = parser.parse_args()
    sdist: Path = args.sdist.resolve()
    with tempfile.TemporaryDirectory(prefix="vllm_own_tests_") as temp:
        workdir = Path(temp)
        (workdir / "tests").symlink_to(sdist / "tests")
        if not args.bare:
            hub_cache(workdir / "hf")
        header, stock = run(args.python, args.tests, "stock", workdir, args.bare)
        _, ours = run(args.python, args.tests, "ours", workdir, args.bare)
    report = {"vllm": header["vllm"], "vllm_file": header["vllm_file"], "sdist": str(sdist),
              "bare": args.bare, **compare(stock, ours)}
    print(f"vLLM {report['vllm']} ({report['vllm_file']}), tests from {sdist}")
    print(f"tests: {report['tests']}; passing stock: {report['passed_stock']}; passing with "
          f"ours: {report['passed_ours']}; passing stock but not with ours: "
          f"{len(report['lost'])}")
    print(f"tests calling a builder (with ours installed): {report['call_a_builder']}; calling "
          f"only ours: {report['call_ours_only']}; calling another: "
          f"{len(report['call_another_builder'])}; never calling ours: "
          f"{len(report['never_call_ours'])}")
    print(f"tests resolving a builder through vLLM's platform hook: "
          f"{report['resolve_a_builder']}; resolving another than ours: "
          f"{len(report['resolve_another_builder'])} (a test that patches the hook itself)")
    for nodeid in report["resolve_another_builder"]:
        print(f"RESOLVED ANOTHER {nodeid}")
    for entry in report["lost"]:
        print(f"LOST {entry['test']} ({entry['outcome']})\n    "
              + entry["error"].replace("\n", "\n    "))
    for nodeid, calls in report["call_another_builder"].items():
        print(f"OTHER BUILDER {nodeid}: {calls}")
    for nodeid in report["collection_errors"]:
        print(f"COLLECTION ERROR (stock) {nodeid}")
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
