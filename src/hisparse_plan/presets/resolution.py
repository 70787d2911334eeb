"""Which model class vLLM 0.34 builds for a config, in the order its registry tries them
(`ModelRegistry.resolve_model_cls`, `model_executor/models/registry.py`, with `model_impl`
"auto" and no conversion):

1. when none of the config's `architectures` is a name of the registry, the Transformers
   modeling backend for the first (`_try_resolve_transformers`): transformers must export a
   model class of that name that may be served (`is_backend_compatible()` or
   `_can_set_attn_implementation()`), and the class is `Transformers` + `MultiModal` (the config
   has a text sub-config) + `MoE` (it has experts: `ModelConfig.is_moe`, the fields of
   `CONFIG_FIELD_ALIASES["num_experts"]`) + `ForCausalLM`
   (`ModelConfig._get_transformers_backend_cls`);
2. else the first architecture the registry names, which loads its own class, or the
   Transformers backend class it names (`_TRANSFORMERS_SUPPORTED_MODELS`: GemmaForCausalLM,
   SmolLM3ForCausalLM, ...);
3. else refused (`_raise_for_unsupported`): a retired architecture
   (`_PREVIOUSLY_SUPPORTED_MODELS`) with the last version that served it, an out-of-tree one
   (`_OOT_SUPPORTED_MODELS`) with its plugin, any other as unknown.

The registry's names and what the backend finds in each transformers class (the transformers
vLLM 0.34 runs with) are the data file data/vllm_resolution.json, written from both by
references/vllm_resolution_data.py. Remote code (`auto_map`) is not run: a config whose
architecture only remote code provides is refused.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, Final, Literal

from hisparse_plan.presets.errors import ConfigError

DATA_FILE: Final = "vllm_resolution.json"
EXPERT_FIELDS: Final = ("num_experts", "moe_num_experts", "n_routed_experts", "num_local_experts")
"""vLLM's `CONFIG_FIELD_ALIASES["num_experts"]` (transformers_utils/config.py), in its order."""
Route = Literal["registry", "transformers_named", "transformers_fallback", "unnamed"]


@cache
def data() -> dict[str, Any]:
    text = resources.files("hisparse_plan.presets").joinpath("data", DATA_FILE).read_text(
        "utf-8")
    loaded: dict[str, Any] = json.loads(text)
    return loaded


@dataclass(frozen=True, slots=True)
class Resolution:
    """The class vLLM builds and how it got there."""

    route: Route
    """`registry`: vLLM's own class; `transformers_named`: the registry names the
    Transformers backend for it; `transformers_fallback`: no architecture is in the registry
    and the backend serves the first; `unnamed`: the config names no architecture (the reader
    lays it out by its model_type)."""
    architecture: str | None
    model_class: str | None
    backend: Mapping[str, Any] | None = None
    """What the backend finds in the transformers class (data/vllm_resolution.json)."""


def _experts(fields: Mapping[str, Any]) -> int:
    """vLLM's `get_num_experts`: the first expert field that is set (a list's first entry)."""
    for name in EXPERT_FIELDS:
        value = fields.get(name)
        if value:
            return int(value[0]) if isinstance(value, list) else int(value)
    return 0


def backend_class(config: Mapping[str, Any]) -> str:
    """`ModelConfig._get_transformers_backend_cls` for a generation model."""
    text = config.get("text_config")
    nested = isinstance(text, Mapping) and "num_hidden_layers" not in config
    fields = text if isinstance(text, Mapping) and nested else config
    return ("Transformers" + ("MultiModal" if nested else "")
            + ("MoE" if _experts(fields) > 0 else "") + "ForCausalLM")


def resolve(config: Mapping[str, Any], origin: str, *, unknown: bool = True) -> Resolution:
    """The class vLLM 0.34 resolves for `config` (its `architectures`), or a ConfigError saying
    why vLLM refuses it. `unknown` False: an architecture vLLM knows in no way (neither
    served, retired nor out of tree) is not refused but `unnamed`, laid out by its model_type
    (a config read for SGLang, which serves architectures vLLM does not)."""
    names = config.get("architectures")
    if not isinstance(names, list) or not names:
        return Resolution("unnamed", None, None)
    archs = [name for name in names if isinstance(name, str)]
    registry: dict[str, str] = data()["registry"]
    named = set(data()["transformers_supported"])
    if archs and not any(arch in registry for arch in archs):
        first = archs[0]
        if first in data()["backend_names"]:
            return Resolution("transformers_fallback", first, first)
        found = data()["backend"].get(first)
        if found is not None and found.get("exported") and found.get("compatible"):
            return Resolution("transformers_fallback", first, backend_class(config), found)
    for arch in archs:
        if arch in registry:
            route: Route = "transformers_named" if arch in named else "registry"
            found = data()["backend"].get(arch) if arch in named else None
            model_class = backend_class(config) if arch in named else registry[arch]
            return Resolution(route, arch, model_class, found)
    refusal = _refusal(archs, origin)
    if not unknown and not any(arch in data()["retired"] or arch in data()["out_of_tree"]
                               for arch in archs):
        return Resolution("unnamed", None, None)
    raise refusal


def _refusal(archs: list[str], origin: str) -> ConfigError:
    """vLLM's `_raise_for_unsupported`, in its order: retired, out of tree, unknown."""
    retired: dict[str, str] = data()["retired"]
    out_of_tree: dict[str, str] = data()["out_of_tree"]
    for arch in archs:
        if arch in retired:
            return ConfigError(
                f"{origin}: architectures: vLLM 0.34 does not serve {arch}: it was supported "
                f"until vLLM v{retired[arch]} and is not anymore (vLLM's registry, "
                "_PREVIOUSLY_SUPPORTED_MODELS), and its Transformers backend cannot serve it "
                "(transformers has no model class of that name that the backend may use); "
                "expected an architecture vLLM 0.34 serves", field="architectures")
        if arch in out_of_tree:
            return ConfigError(
                f"{origin}: architectures: vLLM 0.34 serves {arch} only through the plugin "
                f"{out_of_tree[arch]} (vLLM's registry, _OOT_SUPPORTED_MODELS), which the "
                "planner does not model; expected an architecture vLLM 0.34 serves in-tree",
                field="architectures")
    shown = ", ".join(archs[:3]) or "(none)"
    return ConfigError(
        f"{origin}: architectures: vLLM 0.34 serves none of {shown}: its registry names none "
        "of them and its Transformers backend cannot serve the first (transformers, the "
        f"version vLLM 0.34 runs with, {data()['transformers']}, has no model class of that "
        "name that the backend may use; remote code is not run); expected an architecture "
        "vLLM 0.34 serves", field="architectures")


def vllm_model_class(config: Mapping[str, Any]) -> str | None:
    """The name of the class vLLM 0.34 builds for `config` (None: no architectures named);
    ConfigError where vLLM refuses it."""
    return resolve(config, "config").model_class
