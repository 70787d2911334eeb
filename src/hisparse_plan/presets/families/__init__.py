"""The config.json reader as a registry of architecture families: `model_type` -> its family's
layer layout, as vLLM 0.34's model code builds it. May import models and presets/ only.

One module a
family (or a few alike), each stating the vLLM 0.34 and SGLang 0.5.23 model files it follows and
the layer kinds, heads, head sizes, windows and states those files create.

A `model_type` no family claims is read by the generic (Llama-like) rule. A field that decides
layer kinds in some architecture (`MARKERS`) but is not read by the model's family is refused,
naming it, and so is `attn_type_list` (MiniMax's lightning hybrids) outside MiniMax-M2: a plan
must never be silently wrong about a layer's kind. A family that states cross-layer KV sharing
(Gemma-3n) gives the layers that read another's cache (`Layout.reads_cache_of`), and the
model_types vLLM serves with layouts no family reads yet are refused by name (`unplanned`).
"""

from __future__ import annotations

from typing import Any, Final

from hisparse_plan.presets.errors import ConfigError
from hisparse_plan.presets.families.base import (
    Family,
    Fields,
    Layout,
    SGLangRule,
    given,
)
from hisparse_plan.presets.families.dense import GENERIC, QWEN
from hisparse_plan.presets.families.falcon import FALCON
from hisparse_plan.presets.families.gemma import GEMMA, GEMMA3N
from hisparse_plan.presets.families.gemma4 import GEMMA4
from hisparse_plan.presets.families.hrm_text import HRM_TEXT
from hisparse_plan.presets.families.inkling import INKLING
from hisparse_plan.presets.families.kimi_linear import KIMI_LINEAR
from hisparse_plan.presets.families.lfm2 import LFM2
from hisparse_plan.presets.families.llama4 import LLAMA4
from hisparse_plan.presets.families.mamba_hybrids import (
    FALCON_H1,
    GRANITE_HYBRID,
    JAMBA,
    NEMOTRON_H,
)
from hisparse_plan.presets.families.minicpm3 import MINICPM3
from hisparse_plan.presets.families.minimax import MINIMAX, MINIMAX_M2, refuse_lightning
from hisparse_plan.presets.families.mla import DEEPSEEK_V4, MLA, SPARSE_MLA
from hisparse_plan.presets.families.olmo_hybrid import OLMO_HYBRID
from hisparse_plan.presets.families.qwen_linear import QWEN3_5, QWEN3_NEXT
from hisparse_plan.presets.families.smollm3 import SMOLLM3
from hisparse_plan.presets.families.state_only import MAMBA1, MAMBA2
from hisparse_plan.presets.families.unplanned import UNPLANNED
from hisparse_plan.presets.families.whisper import WHISPER
from hisparse_plan.presets.families.windows import (
    AFMOE,
    COHERE2,
    COHERE2_MOE,
    EXAONE4,
    EXAONE_MOE,
    GPT_OSS,
)
from hisparse_plan.presets.families.zamba2 import ZAMBA2
from hisparse_plan.presets.families.zaya import ZAYA

FAMILIES: Final[tuple[Family, ...]] = (
    GENERIC, QWEN, GEMMA, GEMMA3N, GPT_OSS, COHERE2, EXAONE4, LLAMA4, MLA, SPARSE_MLA,
    DEEPSEEK_V4, JAMBA, NEMOTRON_H, FALCON_H1, GRANITE_HYBRID, QWEN3_NEXT, QWEN3_5,
    KIMI_LINEAR, LFM2, MINIMAX, MINIMAX_M2, MAMBA1, MAMBA2, ZAMBA2, SMOLLM3, MINICPM3,
    FALCON, COHERE2_MOE, EXAONE_MOE, HRM_TEXT, GEMMA4, ZAYA,
    OLMO_HYBRID, AFMOE, WHISPER, INKLING, UNPLANNED,
)
"""Every registered family; GENERIC reads any model_type the others do not claim."""
BY_MODEL_TYPE: Final[dict[str, Family]] = {
    model_type: family for family in FAMILIES for model_type in family.model_types
}
MARKERS: Final = (
    "layer_types", "layers_block_type", "attn_type_list", "attn_layer_period",
    "attn_layer_offset", "hybrid_override_pattern", "full_attention_interval",
    "sliding_window_pattern", "use_sliding_window", "max_window_layers", "no_rope_layers",
    "attention_chunk_size", "sliding_window", "interleaved_sliding_window", "block_configs",
    "linear_attn_config", "attn_layer_indices", "mamba_layers", "global_attn_every_n_layers",
    "swa_layers", "hybrid_layer_ids", "kv_lora_rank", "layer_block_types", "full_attn_idxs",
    "num_kv_shared_layers", "dsa_config",
)
"""Config fields that decide which kind of cache some layer keeps, in some architecture."""
ZERO_IS_ABSENT: Final = frozenset({"num_kv_shared_layers"})
"""Markers whose 0 changes no layer (no layer shares a cache)."""


def family_of(model_type: str | None) -> Family:
    """The family whose reader lays out `model_type` (GENERIC for one no family claims)."""
    return BY_MODEL_TYPE.get(model_type or "", GENERIC)


def renamed_fields(fields: Fields) -> dict[str, Any]:
    """`fields` with the ones its family's config names otherwise under the reader's names
    (`Family.renamed`: Whisper's decoder geometry), before the layers are counted."""
    model_type = fields.get("model_type")
    family = family_of(model_type if isinstance(model_type, str) else None)
    return dict(fields) if family.renamed is None else {**fields, **family.renamed(fields)}


def refuse_unplanned_early(fields: Fields) -> None:
    """A model_type vLLM serves with a layout no family reads is refused by name before any
    field is read (such a config may have no num_hidden_layers to count)."""
    model_type = fields.get("model_type")
    if isinstance(model_type, str) and family_of(model_type) is UNPLANNED and UNPLANNED.read:
        UNPLANNED.read(fields, 0)


def _set(fields: Fields, name: str) -> bool:
    return given(fields, name) and not (name in ZERO_IS_ABSENT and fields.get(name) == 0)


def layer_layout(fields: Fields, layers: int) -> Layout:
    """The layers of the `layers` decoder layers as the model's family reads them, refusing
    any kind-changing field that family does not read."""
    model_type = str(fields.get("model_type") or "")
    family = family_of(model_type)
    if given(fields, "attn_type_list") and family is not MINIMAX_M2:
        return refuse_lightning(fields, layers)
    if family.read is None:
        raise ConfigError(
            f"model_type: {model_type!r} is read by a model of its own (sparse MLA or "
            "DeepSeek-V4), not by a layer rule; expected its indexer or compress fields",
            field="model_type",
        )
    layout = family.read(fields, layers)
    unread = [name for name in MARKERS if name not in layout.reads and _set(fields, name)]
    if unread:
        name = unread[0]
        who = f"model_type {model_type!r}" if model_type else "a config without model_type"
        raise ConfigError(
            f"{name}: it decides layer kinds in some architectures, but vLLM's code for {who} "
            f"does not read it as planned here; refusing rather than guessing the layers' kinds",
            field=name,
        )
    return layout


__all__ = [
    "BY_MODEL_TYPE",
    "FAMILIES",
    "GENERIC",
    "MARKERS",
    "Family",
    "Layout",
    "SGLangRule",
    "family_of",
    "layer_layout",
    "refuse_unplanned_early",
    "renamed_fields",
]
