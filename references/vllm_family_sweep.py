"""The config.json reader's families against vLLM's own model classes, and vLLM's model registry
against the families. Needs vLLM (run it in the vLLM venv, with this checkout's sources first):

    PYTHONPATH=src /work/vllm-venv/bin/python references/vllm_family_sweep.py [--pin] [FAMILY ...]

Gemma-3n's wrapper (Gemma3nForConditionalGeneration) builds timm's vision tower: timm must be
importable (`pip install --target DIR timm --no-deps`, DIR on PYTHONPATH, keeps it out of the
venv, where a timm without torchvision breaks transformers' Gemma-3n config); torchvision is
stood in for like the other packages below.

1. For each registered family (`hisparse_plan.presets.families.FAMILIES`), each fixture of
   tests/hf_configs whose `model_type` the family reads is built twice: with vLLM's model class
   on the meta device (the build of `plan --hf-config X --specs-from-vllm`,
   `adapters.vllm.meta_model`; one process each, with references/vllm_hf_layers.py's stand-ins for
   packages the model modules import but no cache layer needs) and with the reader
   (`build_request` at tensor parallel size 1). The two are compared layer by layer: names, kinds,
   KV heads, head sizes, dtypes, windows, chunks, MLA rows, state shapes and dtypes
   (`meta_model.MODEL_FACTS`), and which layers read which layer's cache (vLLM's
   `kv_sharing_target_layer_name`, the reader's `kv_sharing_target`). A family is equal when
   every fixture vLLM builds here is. The count of equal families is printed last.
2. `--pin` writes what vLLM built for each fixture to tests/hf_configs/NAME/vllm-layers.json:
   tests/test_families.py checks the reader against those files in CI, without vLLM.
3. vLLM's registry (text generation and multimodal architectures) is swept by its model
   modules' source for the layer kinds whose KV layout differs from plain attention (state
   layers, MLA, cross-layer sharing, chunked local attention, sliding windows): each such
   architecture that no family names is listed with what its code has.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CONFIGS = REPO / "tests" / "hf_configs"
PIN = "vllm-layers.json"
MARKERS = {
    "state": re.compile(r"\b(MambaMixer2?|ShortConv|\w*GatedDeltaNet\w*|\w*DeltaAttention|"
                        r"MambaBase|IsHybrid|\w*LinearAttention\w*)\b"),
    "mla": re.compile(r"\b(\w*MLAAttention\w*|MultiHeadLatentAttention\w*|kv_lora_rank)\b"),
    "shared": re.compile(r"\bkv_sharing_target_layer_name\s*="),
    "chunked": re.compile(r"\b(ChunkedLocalAttention|attention_chunk_size)\b"),
    "window": re.compile(r"\bper_layer_sliding_window\s*=\s*(?!None\b)"),
}
"""What a model module's source says about its cache layers, by the kind it makes."""
REFUSING = frozenset({"unplanned", "minimax"})
"""Families whose readers refuse by name (nothing planned, no layer to compare)."""


def text_fields(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's fields, as the reader takes them (`config_file._text_config`)."""
    inner = config.get("text_config")
    if "num_hidden_layers" not in config and isinstance(inner, dict):
        return inner
    return config


def fixtures_by_family() -> dict[str, list[str]]:
    from hisparse_plan.presets.families import family_of

    found: dict[str, list[str]] = defaultdict(list)
    for folder in sorted(CONFIGS.iterdir()):
        config = json.loads((folder / "config.json").read_text())
        found[family_of(text_fields(config).get("model_type")).name].append(folder.name)
    return found


def facts(layers: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each layer's model facts (`MODEL_FACTS`), the engine's settings left out."""
    from hisparse_plan.adapters.vllm.meta_model import MODEL_FACTS

    return {name: {key: spec[key] for key in MODEL_FACTS if spec.get(key) is not None}
            for name, spec in layers.items()}


def compare_one(name: str) -> dict[str, Any]:
    """One fixture: vLLM's layers (when vLLM builds it here) and the reader's, compared."""
    from hisparse_plan.adapters.vllm.layers import layer_dicts
    from hisparse_plan.adapters.vllm.meta_model import check_layers_agree, kv_cache_specs
    from hisparse_plan.errors import PlanError
    from hisparse_plan.presets import Settings, build_request
    from hisparse_plan.presets.config_file import load_config_file

    path = CONFIGS / name / "config.json"
    result: dict[str, Any] = {"name": name}
    try:
        meta = kv_cache_specs(json.loads(path.read_text()), max_model_len=4096)
    except PlanError as error:
        return {**result, "status": "vllm_cannot_build", "why": str(error)[:200]}
    result.update(model_class=meta.model_class, vllm=meta.vllm_version,
                  layers=facts(layer_dicts(meta.specs, 0)), shared=meta.shared)
    try:
        request = build_request(load_config_file(path), Settings(max_model_len=4096))
    except PlanError as error:
        return {**result, "status": "reader_refuses", "why": f"{error.field}: {error}"[:300]}
    try:
        check_layers_agree(request.layers, meta)
    except PlanError as error:
        return {**result, "status": "differ", "why": str(error)[:300]}
    return {**result, "status": "same"}


def run_fixture(name: str, env: dict[str, str]) -> dict[str, Any]:
    done = subprocess.run([sys.executable, __file__, "--one", name], env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return {"name": name, "status": "no_result", "why": done.stderr.strip()[-300:]}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def pin(result: dict[str, Any]) -> None:
    """vLLM's layers of one fixture, each distinct layer once, for tests/test_families.py."""
    specs: dict[str, dict[str, Any]] = {}
    order: list[list[str]] = []
    for layer, spec in result["layers"].items():
        key = next((k for k, v in specs.items() if v == spec), None)
        if key is None:
            key = f"spec{len(specs)}"
            specs[key] = spec
        order.append([layer, key])
    head = {"vllm": result["vllm"], "model_class": result["model_class"], "tp": 1}
    lines = [f"{json.dumps(key)}: {json.dumps(value)}," for key, value in head.items()]
    if result.get("shared"):
        # Layers vLLM gives no spec: each reads its target's cache (kv_sharing_target).
        lines += ['"shared": {', ",\n".join(f" {json.dumps(layer)}: {json.dumps(target)}"
                                            for layer, target in result["shared"].items()),
                  "},"]
    lines += ['"specs": {', ",\n".join(f" {json.dumps(key)}: {json.dumps(spec)}"
                                         for key, spec in specs.items()), "},",
              '"layers": [', ",\n".join(f" {json.dumps(layer)}" for layer in order), "]"]
    # One spec, one layer a line: diffs of a pin read as layers.
    (CONFIGS / result["name"] / PIN).write_text("{\n" + "\n".join(lines) + "\n}\n")


def sweep_families(chosen: list[str], env: dict[str, str], write_pins: bool) -> int:
    from hisparse_plan.presets.families import FAMILIES

    fixtures = fixtures_by_family()
    equal = built_families = 0
    for family in FAMILIES:
        if chosen and family.name not in chosen:
            continue
        results = [run_fixture(name, env) for name in fixtures.get(family.name, [])]
        for result in results:
            print(f"  {result['name']}: {result['status']}"
                  + (f" ({result['model_class']}, {len(result['layers'])} layers)"
                     if "layers" in result else "")
                  + (f": {result['why']}" if "why" in result else ""), flush=True)
            if write_pins and "layers" in result:
                pin(result)
        built = [r for r in results if "layers" in r]
        same = built and all(r["status"] in ("same", "reader_refuses") for r in built)
        compared = [r for r in built if r["status"] == "same"]
        built_families += bool(built)
        equal += bool(same and compared)
        verdict = ("equal layer by layer" if same and compared else
                   "not built by vLLM here" if not built else
                   "refused by the reader" if same else "DIFFERS")
        print(f"{family.name}: {verdict} ({len(results)} fixtures)", flush=True)
    print(f"families equal layer by layer: {equal} of {built_families} that vLLM builds here "
          f"({len(FAMILIES)} registered)")
    return 0


def module_sources(module: str) -> str:
    """The source of a registry module (every file of a package)."""
    dotted = module if module.startswith("vllm.") else f"vllm.model_executor.models.{module}"
    spec = importlib.util.find_spec(dotted)
    if spec is None or spec.origin is None:
        return ""
    origin = Path(spec.origin)
    files = sorted(origin.parent.rglob("*.py")) if origin.name == "__init__.py" else [origin]
    return "\n".join(path.read_text(errors="replace") for path in files)


def sweep_registry() -> None:
    """vLLM's generation architectures whose code makes other caches than plain attention: read
    by a family, refused by name, or named by no family (listed with what their code has)."""
    from vllm.model_executor.models import registry  # type: ignore[import-not-found]

    from hisparse_plan.presets.families import FAMILIES

    family_of_arch = {arch: family.name for family in FAMILIES for arch in family.architectures}
    models = {**registry._TEXT_GENERATION_MODELS, **registry._MULTIMODAL_MODELS}
    sources: dict[str, str] = {}
    uncovered: dict[str, list[str]] = defaultdict(list)
    read = refused = 0
    for arch, (module, _) in sorted(models.items()):
        text = sources.setdefault(module, module_sources(module))
        kinds = [kind for kind, pattern in MARKERS.items() if pattern.search(text)]
        if not kinds:
            continue
        family = family_of_arch.get(arch)
        if family is None:
            uncovered[kinds[0]].append(f"{arch} ({', '.join(kinds)})")
        elif family in REFUSING:
            refused += 1
        else:
            read += 1
    named_by_none = sum(map(len, uncovered.values()))
    print(f"\nvLLM's registry: {len(models)} generation architectures, "
          f"{read + refused + named_by_none} whose code makes other caches than plain "
          f"attention: {read} read by a family, {refused} refused by name, {named_by_none} "
          "named by no family:")
    for kind, archs in uncovered.items():
        print(f"- {kind} ({len(archs)}): {'; '.join(archs)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("families", nargs="*", help="only these families (default: all)")
    parser.add_argument("--pin", action="store_true", help="write tests/hf_configs/*/" + PIN)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--no-registry", action="store_true", help="skip the registry sweep")
    args = parser.parse_args()
    if args.one:
        print(json.dumps(compare_one(args.one)), flush=True)
        return 0
    from vllm_hf_layers import STUBS

    stubs = Path(tempfile.mkdtemp())
    (stubs / "sitecustomize.py").write_text(STUBS)
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "ERROR",
           "PYTHONPATH": os.pathsep.join(
               [str(stubs), str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    sweep_families(args.families, env, args.pin)
    if not args.no_registry:
        sweep_registry()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
