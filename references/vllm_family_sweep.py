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
   tests/presets/test_families.py checks the reader against those files in CI, without vLLM.
3. vLLM's registry (text generation and multimodal architectures) is swept by its model
   modules' source for the layer kinds whose KV layout differs from plain attention (state
   layers, MLA, cross-layer sharing, chunked local attention, sliding windows): each such
   architecture that no family names is listed with what its code has.
4. `--registry-build [ARCH ...]`: every text-generation and multimodal architecture of vLLM's
   registry gets a config (transformers' own config class for the model_type whose class
   transformers names so, with its defaults and at most REGISTRY_LAYERS decoder layers; else a
   tests/hf_configs fixture naming the architecture) and is built with vLLM's class on meta and
   with the reader, compared as in 1. Several architectures a process (batches restart after a
   crash); the table goes to docs/vllm-registry.md and tests/vllm_registry.json
   (tests/presets/test_vllm_registry.py pins it without vLLM). `--registry-table` rewrites both
   from the
   last run's results without building. Architectures named are built again; a whole sweep
   resumes past what the results file (HISPARSE_REGISTRY_RESULTS) holds. Where vLLM fails on
   the harness rather than on the model, the harness makes up the difference, each named below:
   config fields real checkpoints carry (CHECKPOINT_FIELDS, MODEL_TYPES, FIXTURE_FIRST), CPU
   stand-ins for kernels the CPU wheel lacks (`stand_in_cpu_ops`) and constructors run on the
   CPU device (`compute_on_cpu`), none of which shapes a cache. Gemma-3n's and Gemma-4's
   multimodal wrappers need timm (above). Full sweep:

       HISPARSE_REGISTRY_RESULTS=/tmp/registry.jsonl PYTHONPATH=src:TIMM_DIR \
           /work/vllm-venv/bin/python references/vllm_family_sweep.py --registry-build
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
from collections import Counter, defaultdict
from collections.abc import Callable
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
    """vLLM's layers of one fixture, each distinct layer once, for
    tests/presets/test_families.py."""
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


REGISTRY_LAYERS = 4
"""Decoder layers of a registry config (fewer where the class defaults to fewer)."""
REGISTRY_BATCH = 16
REGISTRY_SECONDS = 240
RESULTS = Path(os.environ.get("HISPARSE_REGISTRY_RESULTS")
               or Path(tempfile.gettempdir()) / "hisparse-vllm-registry.jsonl")
"""The results of every run, one JSON line an architecture (the last line of each counts);
HISPARSE_REGISTRY_RESULTS names another file (one per checkout on a shared machine)."""

TABLE_DOC = REPO / "docs" / "vllm-registry.md"
TABLE_PIN = REPO / "tests" / "vllm_registry.json"


def registry_architectures() -> list[str]:
    from vllm.model_executor.models import registry  # type: ignore[import-not-found, unused-ignore]

    return sorted({**registry._TEXT_GENERATION_MODELS, **registry._MULTIMODAL_MODELS})


def model_type_of(arch: str) -> str | None:
    """The model_type whose transformers model class is named `arch`, if any; where several
    are (DeepSeek-V3.2 reuses DeepseekV3ForCausalLM), the one whose config class names it."""
    auto = importlib.import_module("transformers.models.auto.modeling_auto")
    configs = importlib.import_module("transformers.models.auto.configuration_auto")
    found: list[str] = []
    for name in sorted(dir(auto)):
        if not name.endswith("_MAPPING_NAMES"):
            continue
        for model_type, classes in getattr(auto, name).items():
            if arch in (classes if isinstance(classes, (tuple, list)) else (classes,)):
                found.append(str(model_type))
    stem = arch.lower()
    named = [t for t in found if stem.startswith(
        configs.CONFIG_MAPPING_NAMES.get(t, "").removesuffix("Config").lower() or "\0")]

    def fit(model_type: str) -> tuple[int, bool]:
        config = configs.CONFIG_MAPPING_NAMES[model_type].removesuffix("Config").lower()
        return len(config), model_type.replace("-", "").replace("_", "") == config

    return max(named, key=fit) if named else (found[0] if found else None)


def small_config(config_class: type) -> object:
    """The class's defaults with at most REGISTRY_LAYERS decoder layers (the text config's, for
    a multimodal class); the defaults as they are where the class refuses fewer layers."""
    probe = config_class()
    text = probe.get_text_config()
    layers = getattr(text, "num_hidden_layers", None)
    if not isinstance(layers, int) or layers <= REGISTRY_LAYERS:
        return probe
    if getattr(text, "num_kv_shared_layers", 0):
        # The layers that read others' caches are counted from the end (Gemma-3n: 15 of 35):
        # fewer layers would leave none to read.
        return probe
    if text is not probe and "text_config" not in probe.to_dict():
        # The text config sits deeper (Qwen2.5-Omni's thinker_config.text_config): a top-level
        # text_config would be one vLLM never reads.
        return probe
    try:
        if text is probe:
            return config_class(num_hidden_layers=REGISTRY_LAYERS)
        return config_class(text_config={**text.to_dict(), "num_hidden_layers": REGISTRY_LAYERS,
                                         "layer_types": None})
    except Exception:  # a class that ties other fields to its layer count: keep its defaults
        return probe


MODEL_TYPES = {"Llama4ForCausalLM": "llama4_text"}
"""Architectures whose checkpoints carry another config class than the one transformers names
first for them: vLLM's `llama4.py` builds Llama4ForCausalLM from a Llama-4 text config
(`llama4_text`, which has `num_local_experts`), not from the multimodal Llama4Config."""
CHECKPOINT_FIELDS: dict[str, tuple[str, dict[str, Any]]] = {
    "Glm4MoeForCausalLM": ("as zai-org/GLM-4.5-Air", {"head_dim": 128}),
    "DbrxForCausalLM": ("as databricks/dbrx-instruct", {"attn_config": {"rope_theta": 500000}}),
    "AfmoeForCausalLM": ("as arcee-ai/Trinity-Nano-Preview", {
        "score_func": "sigmoid", "route_norm": True, "route_scale": 2.826, "n_group": 1,
        "topk_group": 1}),
    "Qwen3VLMoeForConditionalGeneration": (
        "as Qwen/Qwen3-VL-30B-A3B-Instruct", {"text_config": {"norm_topk_prob": True}}),
    "Glm4vMoeForConditionalGeneration": (
        "as zai-org/GLM-4.5V", {"text_config": {"head_dim": 128, "use_qk_norm": False}}),
    "Lfm2VlForConditionalGeneration": (
        "as LiquidAI/LFM2-VL-1.6B, whose language model is LFM2-1.2B (tests/hf_configs/"
        "lfm2-1.2b)", {"text_config": {
            key: value for key, value
            in json.loads((CONFIGS / "lfm2-1.2b" / "config.json").read_text()).items()
            if key != "architectures"}}),
    "NemotronForCausalLM": ("as nvidia/Minitron-8B-Base", {"num_key_value_heads": 8}),
    "Gemma4ForConditionalGeneration": (
        "of transformers' Gemma4VisionConfig defaults", {"vision_config": {}}),
    "Gemma4UnifiedForConditionalGeneration": (
        "of transformers' Gemma4VisionConfig defaults", {"vision_config": {}}),
}
"""Fields every published checkpoint of the architecture carries but transformers' class
leaves out (vLLM's model code reads them, and fails without): set as the named checkpoint's
config.json has them (transformers' defaults are that checkpoint's sizes otherwise), or, for a
tower the class leaves empty (Gemma-4's vision tower, which every Gemma-4 checkpoint has),
the tower's own class defaults; no such field shapes a cache."""
FIXTURE_FIRST = frozenset({
    "MiniMaxM2ForCausalLM", "Lfm2ForCausalLM", "Lfm2MoeForCausalLM", "Glm4MoeLiteForCausalLM",
    "KimiLinearForCausalLM", "NemotronHForCausalLM",
})
"""Architectures read from their tests/hf_configs fixture (a published config.json) rather than
transformers' class, whose defaults lack fields the checkpoints carry and vLLM's code reads
(MiniMax-M2's rotary_dim, LFM2's block_dim, GLM-4.7-Flash's first_k_dense_replace) or differ
from every checkpoint (Kimi-Linear's class defaults to a RoPE MLA that vLLM's NoPE-only
Kimi-K3 attention refuses), or describe a model vLLM's CPU build refuses for a reason that shapes
no cache (Nemotron-H's class defaults to an MoE Nemotron-H, whose relu2 experts vLLM runs on
CUDA, XPU and ROCm only; Nemotron-H-4B has no experts)."""


def fixture_naming(arch: str) -> tuple[dict[str, Any], str] | None:
    """The first tests/hf_configs fixture whose architectures name `arch`."""
    for folder in sorted(CONFIGS.iterdir()):
        data = json.loads((folder / "config.json").read_text())
        if arch in (data.get("architectures") or []):
            return data, f"fixture {folder.name}"
    return None


def with_fields(config: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """`config` with `fields` set, nested objects merged key by key."""
    merged = dict(config)
    for key, value in fields.items():
        inner = merged.get(key)
        merged[key] = (with_fields(inner, value) if isinstance(value, dict)
                       and isinstance(inner, dict) else value)
    return merged


def field_names(fields: dict[str, Any], prefix: str = "") -> list[str]:
    """The dotted names of the leaves of `fields`."""
    return [name for key, value in fields.items()
            for name in (field_names(value, f"{prefix}{key}.") if isinstance(value, dict)
                         else [f"{prefix}{key}"])]


def registry_config(arch: str) -> tuple[dict[str, Any] | None, str]:
    """A config for `arch` and where it came from, or None and why there is none."""
    if arch in FIXTURE_FIRST and (fixture := fixture_naming(arch)) is not None:
        return fixture
    model_type = MODEL_TYPES.get(arch) or model_type_of(arch)
    if model_type is not None:
        auto = importlib.import_module("transformers.models.auto.configuration_auto")
        try:
            config = small_config(auto.CONFIG_MAPPING[model_type]).to_dict()  # type: ignore[attr-defined]
        except Exception as error:  # the class fails to import or to build its defaults
            return None, f"transformers' {model_type} config: {type(error).__name__}: {error}"
        # vLLM registers its own config classes under model_types of its own by setting the
        # class's model_type (`_register_config_class`: DeepseekV3Config becomes "deepseek_v32"
        # once DeepSeek-V3.2 was built in this process): the mapping's key is the class's own.
        config = {**config, "model_type": model_type, "architectures": [arch]}
        if arch in CHECKPOINT_FIELDS:
            checkpoint, fields = CHECKPOINT_FIELDS[arch]
            names = field_names(fields)
            more = f" and {len(names) - 3} more" if len(names) > 3 else ""
            return (with_fields(config, fields),
                    f"transformers {model_type}, {', '.join(names[:3])}{more} {checkpoint}")
        return config, f"transformers {model_type}"
    fixture = fixture_naming(arch)
    if fixture is not None:
        return fixture
    return None, ("no config: transformers has no class of that name (remote code) and no "
                  "fixture names it")


CPU_MISSING_OPS = ("gelu_new", "gelu_fast", "gelu_quick")
"""Kernels of vLLM's `_C` library its CPU wheel lacks, though `layers/activation.py`'s NewGELU,
FastGELU and QuickGELU take them at construction on a CPU platform (their `forward_cpu` never
calls them on x86)."""


def stand_in_cpu_ops() -> None:
    """Each op of CPU_MISSING_OPS the loaded `_C` lacks becomes a Python function of the same
    contract (writes the activation of `x` into `out`): an activation shapes no cache, and the
    meta build never runs it."""
    import math

    import torch

    def gelu_tanh(out: torch.Tensor, x: torch.Tensor) -> None:
        out.copy_(0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi)
                                             * (x + 0.044715 * x.pow(3)))))

    def gelu_quick(out: torch.Tensor, x: torch.Tensor) -> None:
        out.copy_(x * torch.sigmoid(1.702 * x))

    from vllm.triton_utils import triton  # type: ignore[import-not-found, unused-ignore]

    if not hasattr(triton, "set_allocator"):
        # CPU triton has no kernel scratch allocator; vLLM's FLA Gated DeltaNet layers set one
        # at construction (triton_utils/allocation.py, OLMo-Hybrid's): nothing a cache holds.
        triton.set_allocator = lambda alloc_fn: None
    ops = {"gelu_new": gelu_tanh, "gelu_fast": gelu_tanh, "gelu_quick": gelu_quick}
    for name in CPU_MISSING_OPS:
        try:
            getattr(torch.ops._C, name)
        except (AttributeError, RuntimeError):
            setattr(torch.ops._C, name, ops[name])


def compute_on_cpu() -> None:
    """Constructors that turn a tensor they make into Python numbers (Bloom's ALiBi slopes,
    `models/bloom.py`'s `_get_alibi_slopes`, `.tolist()`; `layers/activation.py`'s XIELU,
    Apertus's activation, `.item()`) run on the CPU device: on the meta device a tensor has
    no data to read. Neither value shapes a cache (ALiBi biases scores, XIELU is an MLP's)."""
    import functools

    import torch
    from vllm.model_executor.layers import activation  # type: ignore[import-not-found]
    from vllm.model_executor.models import bloom  # type: ignore[import-not-found, unused-ignore]

    def on_cpu(function: Callable[..., object]) -> Callable[..., object]:
        if getattr(function, "on_cpu", False):
            return function

        @functools.wraps(function)
        def run(*args: object, **kwargs: object) -> object:
            with torch.device("cpu"):
                return function(*args, **kwargs)

        run.on_cpu = True  # type: ignore[attr-defined]
        return run

    bloom._get_alibi_slopes = on_cpu(bloom._get_alibi_slopes)
    activation.XIELU.__init__ = on_cpu(activation.XIELU.__init__)


def registry_one(arch: str) -> dict[str, Any]:
    """One architecture: vLLM's meta build and the reader's layers, compared."""
    from hisparse_plan.adapters.vllm.layers import layer_dicts
    from hisparse_plan.adapters.vllm.meta_model import kv_cache_specs
    from hisparse_plan.errors import PlanError

    stand_in_cpu_ops()
    compute_on_cpu()

    config, source = registry_config(arch)
    result: dict[str, Any] = {"name": arch, "source": source}
    if config is None:
        return {**result, "status": "no_config"}
    result["config"] = config
    # vLLM sizes its parallel groups by the first model a process builds (an expert-parallel
    # group only for MoE models): start each architecture afresh.
    from vllm.distributed import parallel_state  # type: ignore[import-not-found, unused-ignore]

    parallel_state.destroy_model_parallel()
    parallel_state.destroy_distributed_environment()
    length = 4096
    for length in (4096, 2048, 448):  # the longest vLLM derives for the config
        try:
            meta = kv_cache_specs(config, max_model_len=length)
            break
        except PlanError as error:
            if "greater than the derived" not in str(error) or length == 448:
                return {**result, "status": "vllm_cannot_build", "why": str(error)[:300]}
    result.update(model_class=meta.model_class, vllm=meta.vllm_version, length=length,
                  shared=meta.shared)
    try:
        result["layers"] = facts(layer_dicts(meta.specs, 0))
    except PlanError as error:  # a spec kind the planner does not model (CrossAttentionSpec)
        kinds = sorted({type(spec).__name__ for spec in meta.specs.values()})
        return {**result, "status": "unmodelled_kind", "kinds": kinds,
                "why": f"vLLM builds {', '.join(kinds)}: {error}"[:300]}
    return {**result, **reader_verdict(result)}


def reader_verdict(entry: dict[str, Any]) -> dict[str, str]:
    """The reader on a built entry's stored config, without transformers (the config is
    transformers' whole to_dict already, so the verdict does not hang on its version), against
    the layers vLLM built: same, differ (the first difference) or reader_refuses (why)."""
    from hisparse_plan.adapters.vllm.meta_model import MODEL_FACTS
    from hisparse_plan.errors import PlanError
    from hisparse_plan.presets import Settings, build_request
    from hisparse_plan.presets.config_file import model_from_config

    try:
        request = build_request(
            model_from_config(entry["config"], origin=entry["name"], use_transformers=False),
            Settings(max_model_len=entry["length"]))
    except PlanError as error:
        return {"status": "reader_refuses", "why": f"{error.field}: {error}"[:300]}
    ours = {name: {key: value for key, value
                   in spec.model_dump(mode="json", exclude_none=True).items()
                   if key in MODEL_FACTS}
            for name, spec in request.layers.items()
            if getattr(spec, "kv_sharing_target", None) is None}
    shared = {name: str(target) for name, spec in request.layers.items()
              if (target := getattr(spec, "kv_sharing_target", None)) is not None}
    theirs = entry["layers"]
    if list(ours) != list(theirs):
        return {"status": "differ", "why": f"layer names: reader {list(ours)[:2]}..., vLLM "
                                           f"{list(theirs)[:2]}... ({len(ours)} / {len(theirs)})"}
    for name, facts_of in theirs.items():
        if ours[name] != facts_of:
            return {"status": "differ", "why": f"{name}: reader {ours[name]}, vLLM {facts_of}"}
    if shared != entry.get("shared", {}):
        return {"status": "differ", "why": f"cache sharing: reader {shared}, vLLM "
                                           f"{entry.get('shared', {})}"}
    return {"status": "same"}


def registry_batch(archs: list[str]) -> None:
    """Child: one JSON line per architecture, each bounded by REGISTRY_SECONDS."""
    import signal

    def stop(signum: int, frame: object) -> None:
        del signum, frame
        raise TimeoutError(f"no answer in {REGISTRY_SECONDS} s")

    signal.signal(signal.SIGALRM, stop)
    for arch in archs:
        signal.alarm(REGISTRY_SECONDS)
        try:
            line = registry_one(arch)
        except Exception as error:  # anything vLLM's model code raises, named
            line = {"name": arch, "status": "sweep_error",
                    "why": f"{type(error).__name__}: {error}"[:300]}
        signal.alarm(0)
        print(json.dumps(line), flush=True)


def sweep_registry_build(chosen: list[str], env: dict[str, str]) -> None:
    """Parent: batches of architectures, each batch restarted past an architecture that took
    its process down; results appended to RESULTS."""
    archs = chosen or registry_architectures()
    # A whole sweep resumes past what RESULTS holds; architectures named are built again.
    done = {json.loads(line)["name"] for line in RESULTS.read_text().splitlines()} if (
        RESULTS.exists() and not chosen) else set()
    left = [arch for arch in archs if arch not in done]
    while left:
        batch, left = left[:REGISTRY_BATCH], left[REGISTRY_BATCH:]
        run = subprocess.run([sys.executable, __file__, "--registry-batch", ",".join(batch)],
                             env=env, capture_output=True, text=True, check=False,
                             timeout=REGISTRY_SECONDS * len(batch) + 120)
        lines = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
        with RESULTS.open("a") as out:
            for line in lines:
                out.write(json.dumps(line) + "\n")
                print(f"{line['name']}: {line['status']}", flush=True)
        if len(lines) < len(batch):
            crashed = batch[len(lines)]
            with RESULTS.open("a") as out:
                out.write(json.dumps({"name": crashed, "status": "sweep_error",
                                      "why": run.stderr.strip()[-300:]}) + "\n")
            left = batch[len(lines) + 1:] + left
    write_registry_table()


def write_registry_table() -> None:
    """docs/vllm-registry.md and tests/vllm_registry.json from RESULTS (the last line of each
    architecture)."""
    results: dict[str, dict[str, Any]] = {}
    for line in RESULTS.read_text().splitlines():
        entry = json.loads(line)
        if "layers" in entry:  # the reader as it is now, on what vLLM built then
            entry.pop("why", None)
            entry.update(reader_verdict(entry))
        results[entry["name"]] = entry
    counts = Counter(entry["status"] for entry in results.values())
    built = sum(counts[s] for s in ("same", "differ", "reader_refuses", "unmodelled_kind"))
    rows = ["| architecture | config | vLLM 0.34 on meta | reader | first difference or why |",
            "|---|---|---|---|---|"]
    for arch, entry in sorted(results.items()):
        status = entry["status"]
        vllm = (f"{entry['model_class']}, {len(entry['layers'])} cache layers"
                if "layers" in entry else f"{entry['model_class']}: {', '.join(entry['kinds'])}"
                if "kinds" in entry else status.replace("_", " "))
        reader = {"same": "equal", "differ": "DIFFERS", "reader_refuses": "refuses",
                  "unmodelled_kind": "not compared"}.get(status, "")
        why = " ".join(str(entry.get("why", "")).split()).replace("|", "/")[:220]
        rows.append(f"| {arch} | {entry.get('source', '')} | {vllm} | {reader} | {why} |")
    TABLE_DOC.write_text(
        "# vLLM 0.34's registry, architecture by architecture\n\n"
        "Written by `references/vllm_family_sweep.py --registry-build` (vLLM 0.34 venv): every "
        "text-generation and multimodal architecture of vLLM 0.34's registry, with a config from "
        "transformers' own class for it (defaults, at most 4 decoder layers) or a "
        "tests/hf_configs fixture, built with vLLM's model class on the meta device and read by "
        "the config reader, compared layer by layer (kinds, heads, head sizes, dtypes, windows, "
        "chunks, MLA rows, state shapes and dtypes, cross-layer sharing, names). "
        "tests/presets/test_vllm_registry.py pins this table without vLLM.\n\n"
        f"{len(results)} architectures: {built} built on meta, {counts['same']} equal, "
        f"{counts['reader_refuses']} refused by the reader, {counts['differ']} differing; "
        f"{len(results) - built} not built ("
        + ", ".join(f"{n} {s.replace('_', ' ')}" for s, n in sorted(counts.items())
                    if s not in ("same", "differ", "reader_refuses", "unmodelled_kind"))
        + ").\n\n"
        + "\n".join(rows) + "\n")
    # Configs only where vLLM built something for the reader to be checked against.
    keys = ("source", "status", "model_class", "length", "layers", "shared", "config")
    pinned = {arch: {key: entry[key] for key in keys if key in entry
                     and (key != "config" or "layers" in entry)}
              for arch, entry in sorted(results.items())}
    TABLE_PIN.write_text("{\n" + ",\n".join(f"{json.dumps(arch)}: {json.dumps(entry)}"
                                              for arch, entry in pinned.items()) + "\n}\n")
    print(f"{len(results)} architectures: {built} built, {counts['same']} equal; "
          f"{dict(counts)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("families", nargs="*", help="only these families (default: all)")
    parser.add_argument("--pin", action="store_true", help="write tests/hf_configs/*/" + PIN)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--no-registry", action="store_true", help="skip the registry sweep")
    parser.add_argument("--registry-build", action="store_true",
                        help="build every registry architecture (or those named) and compare")
    parser.add_argument("--registry-table", action="store_true",
                        help="rewrite the registry table from the last run's results")
    parser.add_argument("--registry-batch", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(compare_one(args.one)), flush=True)
        return 0
    if args.registry_batch:
        registry_batch(args.registry_batch.split(","))
        return 0
    if args.registry_table:
        write_registry_table()
        return 0
    from vllm_hf_layers import STUBS

    stubs = Path(tempfile.mkdtemp())
    (stubs / "sitecustomize.py").write_text(STUBS)
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "ERROR",
           "PYTHONPATH": os.pathsep.join(
               [str(stubs), str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    if args.registry_build:
        sweep_registry_build(args.families, env)
        return 0
    sweep_families(args.families, env, args.pin)
    if not args.no_registry:
        sweep_registry()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
