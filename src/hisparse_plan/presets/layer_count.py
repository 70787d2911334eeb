"""The most decoder layers a model's config may name, checked before anything is built per
layer.

No published model comes near `MAX_LAYERS`: the deepest (Llama-3.1-405B) has 126 decoder
layers, and DeepSeek-V3's and GLM-5's have 61 and 78. The bound is still far above any of them
and below the 100,000 layers the planner is measured at (benchmarks/bench_scale.py), so every
config.json that is read plans at a size that is known to work. A config naming more (a 1 KB
file can say 10**9) is refused before transformers or the layer rules build a list with an
entry per layer: such lists took gigabytes and minutes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Final

from pydantic import Field

from hisparse_plan.models.json_input import path_step
from hisparse_plan.presets.errors import ConfigError

MAX_LAYERS: Final = 2**16
"""65,536 decoder layers (or MTP draft layers) at most."""
LAYER_FIELDS: Final = ("num_hidden_layers", "num_nextn_predict_layers")
"""Config fields that count layers, each of which gets an entry in some per-layer list."""
LayerCount = Annotated[int, Field(ge=1, le=MAX_LAYERS)]
"""A decoder layer count: at least one, at most MAX_LAYERS."""
DraftLayerCount = Annotated[int, Field(ge=0, le=MAX_LAYERS)]
"""A count of MTP draft layers: none, or at most MAX_LAYERS."""


def check_layer_counts(config: Mapping[str, Any], origin: str) -> None:
    """Refuse a config that counts more than MAX_LAYERS layers in any `LAYER_FIELDS` field,
    at its top level or in any object inside it (a multimodal wrapper's `text_config`, and a
    `text_config` inside that: transformers builds each of them)."""
    seen: set[int] = set()  # a dict handed in by a caller may contain itself
    stack: list[tuple[Mapping[str, Any], str]] = [(config, "")]
    while stack:
        fields, where = stack.pop()
        if id(fields) in seen:
            continue
        seen.add(id(fields))
        for name in LAYER_FIELDS:
            value = fields.get(name)
            if isinstance(value, int | float) and not isinstance(value, bool) and (
                    value > MAX_LAYERS):
                field = (where + path_step(name)).lstrip(".")
                raise ConfigError(
                    f"{origin}: {field}: expected at most {MAX_LAYERS} layers (no model has "
                    f"nearly so many; see docs/planning-rules.md#input-files), got "
                    f"{_shown(value)}",
                    field=field,
                )
        stack.extend((child, where + path_step(str(key))) for key, child in fields.items()
                     if isinstance(child, Mapping))
        stack.extend((item, f"{where}{path_step(str(key))}[{i}]")
                     for key, child in fields.items() if isinstance(child, list)
                     for i, item in enumerate(child) if isinstance(item, Mapping))


def _shown(value: float) -> str:
    """A huge count readably, without converting an integer of thousands of digits to text
    (Python refuses past 4300)."""
    if isinstance(value, int) and value.bit_length() > 80:
        return f"an integer of about {value.bit_length() * 30103 // 100000 + 1} digits"
    return repr(value)
