"""Writes the data the config reader resolves a model with, from the engines' own code:

- src/hisparse_plan/presets/data/vllm_resolution.json (vLLM venv): vLLM 0.34's registry
  (`model_executor/models/registry.py`: every architecture it names -> the class it loads, the
  Transformers backend's own names, the retired and out-of-tree architectures), and for each
  model class of transformers' causal-LM enumeration (the transformers vLLM 0.34 runs with)
  and each class the registry names the backend for,
  what vLLM's Transformers modeling backend finds in it: whether the class may be served
  (`is_backend_compatible() or _can_set_attn_implementation()`, `_try_resolve_transformers`)
  and the module path of each decoder layer's attention inside `AutoModel.from_config` (the
  module whose `forward` calls the attention interface and which declares its `layer_idx`,
  `transformers/fusers/attention.py`), built here from transformers alone on the meta device;
- src/hisparse_plan/presets/data/transformers_attribute_maps.json (`--attribute-maps`, any venv
  with transformers): every config class's `attribute_map` that maps a name, by model_type,
  with the version and how many config classes it read.

    PYTHONPATH=src /work/vllm-venv/bin/python references/vllm_resolution_data.py
    PYTHONPATH=src /work/main/.venv/bin/python references/vllm_resolution_data.py --attribute-maps
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import json
import textwrap
from pathlib import Path
from typing import Any, Final

REPO: Final = Path(__file__).resolve().parent.parent
DATA: Final = REPO / "src" / "hisparse_plan" / "presets" / "data"
LAYERS: Final = 2
"""Decoder layers each class is built with (the path of layer i does not depend on the count)."""


def attribute_maps() -> dict[str, Any]:
    transformers = importlib.import_module("transformers")
    configs = importlib.import_module("transformers.models.auto.configuration_auto")
    maps: dict[str, dict[str, str]] = {}
    for model_type in sorted(configs.CONFIG_MAPPING_NAMES):
        try:
            config_class = configs.CONFIG_MAPPING[model_type]
        except Exception:
            continue
        maps[model_type] = dict(sorted(getattr(config_class, "attribute_map", {}).items()))
    # Only the classes that map a name: every other class's map is empty.
    return {"transformers": transformers.__version__, "config_classes": len(maps),
            "attribute_maps": {key: value for key, value in maps.items() if value}}


def _calls_interface(module_class: type) -> bool:
    """Whether the class's `forward` looks up ALL_ATTENTION_FUNCTIONS and calls what it got."""
    try:
        forward = getattr(module_class, "forward")  # noqa: B009 - any nn.Module class
        tree = ast.parse(textwrap.dedent(inspect.getsource(inspect.unwrap(forward))))
    except (AttributeError, OSError, SyntaxError, TypeError):
        return False
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            value = node.value.func if isinstance(node.value, ast.Call) else node.value
            if isinstance(value, (ast.Attribute, ast.Subscript)) and isinstance(
                    value.value, ast.Name) and value.value.id == "ALL_ATTENTION_FUNCTIONS":
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names.update(t.id for t in targets if isinstance(t, ast.Name))
    return sum(isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
               and node.func.id in names for node in ast.walk(tree)) == 1


def small(config: Any) -> Any:  # noqa: ANN401 - a transformers config
    text = config.get_text_config()
    if isinstance(getattr(text, "num_hidden_layers", None), int) and (
            text.num_hidden_layers > LAYERS) and not getattr(text, "num_kv_shared_layers", 0):
        try:
            text.num_hidden_layers = LAYERS
            if isinstance(getattr(text, "layer_types", None), list):
                text.layer_types = text.layer_types[:LAYERS]
        except Exception:
            pass
    return config


def backend_entry(model_type: str, arch: str) -> dict[str, Any]:
    """What vLLM's Transformers backend finds in transformers' class `arch`."""
    import torch

    transformers = importlib.import_module("transformers")
    configs = importlib.import_module("transformers.models.auto.configuration_auto")
    model_class = getattr(transformers, arch, None)
    if model_class is None:
        return {"model_type": model_type, "exported": False}
    entry: dict[str, Any] = {
        "model_type": model_type, "exported": True,
        "compatible": bool(model_class.is_backend_compatible()
                           or model_class._can_set_attn_implementation())}
    from vllm_transformers_sweep import CHECKPOINTS

    config_class = configs.CONFIG_MAPPING[model_type]
    published = [fields for _, fields in CHECKPOINTS.values()
                 if fields.get("model_type") == model_type]
    try:
        # A published checkpoint where the sweep names one (Dots1Config's defaults have no
        # experts, which its model cannot be built without); else the class's defaults.
        config = small(config_class.from_dict(published[0]) if published else config_class())
        with torch.device("meta"):
            model = transformers.AutoModel.from_config(config)
    except Exception as error:
        return {**entry, "built": f"{type(error).__name__}: {error}"[:200]}
    paths = {}
    text = config.get_text_config()
    for name, module in model.named_modules():
        index = getattr(module, "layer_idx", None)
        # Only the text model's modules dispatch to vLLM: the backend patches the attention
        # implementation of the text config alone (`AttentionFuser.validate`).
        if getattr(module, "config", text) is not text:
            continue
        if isinstance(index, int) and not isinstance(index, bool) and _calls_interface(
                type(module)):
            parts = name.split(".")
            where = [k for k, part in enumerate(parts) if part == str(index)]
            if where:
                parts[where[-1]] = "{i}"
            paths[index] = ".".join(parts)
    templates = sorted(set(paths.values()))
    entry["attention"] = templates[0] if len(templates) == 1 else templates
    entry["layers"] = len(paths)
    entry["mla"] = any(hasattr(module, "kv_b_proj") for module in model.modules())
    # `Base._get_attn_cls`: a module that is not causal makes a text model encoder-only.
    entry["encoder"] = any(getattr(module, "is_causal", True) is False
                           for module in model.modules())
    return entry


def resolution_data() -> dict[str, Any]:
    from vllm.model_executor.models import registry  # type: ignore[import-not-found]

    transformers = importlib.import_module("transformers")
    modeling = importlib.import_module("transformers.models.auto.modeling_auto")
    vllm = importlib.import_module("vllm")
    models = {arch: model.class_name if hasattr(model, "class_name") else arch
              for arch, model in sorted(registry.ModelRegistry.models.items())}
    backend = {}
    for model_type, arch in sorted(modeling.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items()):
        for name in arch if isinstance(arch, (list, tuple)) else (arch,):
            if name not in backend:
                backend[name] = backend_entry(model_type, name)
    from vllm_family_sweep import model_type_of

    # The multimodal classes the registry names the backend for (Aria, Emu3, ...).
    for name in sorted(registry._TRANSFORMERS_SUPPORTED_MODELS):
        if name not in backend and (model_type := model_type_of(name)) is not None:
            backend[name] = backend_entry(model_type, name)
    return {
        "vllm": vllm.__version__, "transformers": transformers.__version__,
        "registry": models,
        "transformers_supported": sorted(registry._TRANSFORMERS_SUPPORTED_MODELS),
        "backend_names": sorted(registry._TRANSFORMERS_BACKEND_MODELS),
        "retired": dict(sorted(registry._PREVIOUSLY_SUPPORTED_MODELS.items())),
        "out_of_tree": dict(sorted(registry._OOT_SUPPORTED_MODELS.items())),
        "backend": backend,
    }


def write(path: Path, data: dict[str, Any]) -> None:
    lines = [f"{json.dumps(key)}: {json.dumps(value)}" for key, value in data.items()
             if not isinstance(value, dict)]
    for key, value in data.items():
        if isinstance(value, dict):
            inner = ",\n".join(f" {json.dumps(k)}: {json.dumps(v)}" for k, v in value.items())
            lines.append(f"{json.dumps(key)}: {{\n{inner}\n}}")
    path.write_text("{\n" + ",\n".join(lines) + "\n}\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attribute-maps", action="store_true")
    args = parser.parse_args()
    if args.attribute_maps:
        write(DATA / "transformers_attribute_maps.json", attribute_maps())
    else:
        write(DATA / "vllm_resolution.json", resolution_data())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
