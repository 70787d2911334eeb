"""What one architecture family's reader gives (`Layout`), how a family is registered
(`Family`, with what SGLang does with it: `SGLangRule`), and the field readers every family
shares. A reader reads a (text) config.json's fields, after transformers' defaults where
transformers is installed, and returns the layers vLLM 0.34's model code for the family builds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from hisparse_plan.presets.errors import ConfigError
from hisparse_plan.presets.mamba_states import StateGeometry
from hisparse_plan.presets.regular import LayerKind

Fields = Mapping[str, Any]

LAYER_TYPE_KINDS: Final[dict[str, LayerKind]] = {
    "full_attention": "full", "sliding_attention": "sliding",
}
"""`layer_types` of a model whose layers are full or sliding-window attention."""


@dataclass(frozen=True)
class Layout:
    """The layers one family's rule gives, and the markers that rule reads."""

    kinds: list[LayerKind]
    reads: tuple[str, ...]
    """The kind-deciding fields (`MARKERS`) this family's rule reads; any other is refused."""
    states: StateGeometry | None = None
    """The state layers' geometry (Mamba, Gated DeltaNet, short convolution, KDA)."""
    names: Mapping[str, object] = field(default_factory=dict)
    """`LayerNames` fields (templates, Zamba2's offset and slots) where vLLM's code for the
    model names layers otherwise."""
    fields: Mapping[str, Any] = field(default_factory=dict)
    """Config fields as vLLM's code for the family uses them, in place of the file's: Cohere's
    window + 1, a head size vLLM derives whatever `head_dim` says, vLLM's own config class's
    defaults."""
    reads_cache_of: Mapping[int, int] = field(default_factory=dict)
    """Cross-layer KV sharing: layer i keeps no cache and reads layer j's (Gemma-3n's
    `num_kv_shared_layers`, vLLM's `kv_sharing_target_layer_name`); the request's layer i
    names layer j's in `kv_sharing_target`."""
    heads: Mapping[int, tuple[int, int]] = field(default_factory=dict)
    """Layer i's (KV heads, head size) where they are not the model's (Gemma-4's full layers:
    `families.gemma4`)."""


@dataclass(frozen=True)
class SGLangRule:
    """Whether the SGLang target plans a family (which window layers get a pool of their own
    is the target's rule, by architecture: targets/sglang/served/architectures.py)."""

    refusal: str | None = None
    """Why the SGLang target does not plan the family (None: it does)."""


@dataclass(frozen=True)
class Family:
    """One `model_type` family: its reader, and the engine code it follows."""

    name: str
    model_types: tuple[str, ...]
    architectures: tuple[str, ...]
    """vLLM 0.34 registry names (`architectures`) this family's reader lays out."""
    read: Callable[[Fields, int], Layout] | None
    """The reader; None for a family read by a model of its own (sparse MLA, DeepSeek-V4)."""
    vllm: str
    """The vLLM 0.34 model files followed."""
    sglang: SGLangRule = SGLangRule()
    renamed: Callable[[Fields], dict[str, Any]] | None = None
    """Fields the reader reads that the family's config names otherwise (Whisper's decoder
    geometry), read before the layers are counted; None for a config that uses the names."""


def given(fields: Fields, name: str) -> bool:
    """Whether `name` is set to something that could change a kind (not null, false or empty)."""
    value = fields.get(name)
    return value is not None and value is not False and value != [] and value != ""


def integer(fields: Fields, name: str, why: str) -> int:
    value = fields.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigError(f"{name}: {why}; expected a non-negative integer, got {value!r}",
                          field=name)
    return value


def positive(fields: Fields, name: str, why: str) -> int:
    value = integer(fields, name, why)
    if value == 0:
        raise ConfigError(f"{name}: {why}; expected a positive integer, got 0", field=name)
    return value


def layer_list(fields: Fields, name: str, layers: int) -> list[Any]:
    value = fields.get(name)
    if not isinstance(value, (list, str)) or len(value) < layers:
        got = len(value) if isinstance(value, (list, str)) else repr(value)
        raise ConfigError(
            f"{name}: expected an entry for each of the {layers} layers, got {got}", field=name
        )
    return list(value[:layers])


def from_layer_types(fields: Fields, layers: int, kinds: Mapping[str, LayerKind],
                     model: str) -> list[LayerKind]:
    """Each layer's kind from `layer_types`, refusing a value vLLM's code for `model` does not
    build."""
    values = layer_list(fields, "layer_types", layers)
    unknown = sorted({str(v) for v in values} - set(kinds))
    if unknown:
        raise ConfigError(
            f"layer_types: {model} layers are {', '.join(kinds)} in vLLM's model code; got "
            f"{', '.join(unknown)}",
            field="layer_types",
        )
    return [kinds[v] for v in values]


def every_nth(layers: int, every: int, at: LayerKind, rest: LayerKind) -> list[LayerKind]:
    """Layer i is `at` when i + 1 is a multiple of `every`, else `rest`."""
    return [at if (i + 1) % every == 0 else rest for i in range(layers)]
