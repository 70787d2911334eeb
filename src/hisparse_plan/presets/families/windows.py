"""Sliding-window patterns fixed by a family's own code.

- `gpt_oss`: vLLM 0.34's `models/gpt_oss.py` slides on even layers (`sliding_window`) and not
  on odd ones, whatever `layer_types` says; `model.layers.{i}.attn.attn`, `num_key_value_heads`
  KV heads of `head_dim`. SGLang 0.5.23's `srt/models/gpt_oss.py` is a hybrid-SWA architecture
  (`SWA_SINK_ARCHS`): window layers in a pool of their own.
- `cohere2` (Command-A, Command-R7B): vLLM's `models/commandr.py` (`CohereForCausalLM` for
  `Cohere2ForCausalLM`) slides where `layer_types` says `sliding_attention` (transformers
  writes it out from `sliding_window_pattern`, default 4: three sliding layers, then a full
  one) with a window of `sliding_window + 1` tokens: a Cohere window layer sees positions
  `[pos - sliding_window, pos]`, and vLLM's cache keeps them all (4097 for Command-A). Heads are
  `hidden_size / num_attention_heads` wide (transformers' Cohere2Config sets `head_dim` so).
  SGLang's `srt/models/commandr.py` is not a hybrid-SWA architecture: one pool.
- `exaone4` (EXAONE-4.0): vLLM's `models/exaone4.py` slides by `sliding_window` where
  `layer_types` says `sliding_attention`; transformers' Exaone4Config writes it out from an
  integer `sliding_window_pattern` (default 4; layer i slides unless i + 1 is a multiple) when
  the model has a window, and every layer is full without one. Where `layer_types` is given,
  neither reads `sliding_window_pattern` (EXAONE-4.0-32B publishes `"LLLG"` beside its
  `layer_types`), so its value is left unread. SGLang's `srt/models/exaone4.py`: one pool.
- `exaone_moe` (K-EXAONE): vLLM's `models/exaone_moe.py` (`ExaoneMoeAttention`) reads the
  kinds from `layer_types` as EXAONE-4 does (transformers' ExaoneMoeConfig writes them out from
  `sliding_window_pattern` the same way), and a sliding layer's window from its entry of
  `sliding_windows` where the config has that list (a 0 or null entry: no window), else
  `sliding_window`.
- `afmoe` (Arcee's Trinity): vLLM's `models/afmoe.py` slides by `sliding_window` where
  `layer_types` says `sliding_attention`; transformers' AfmoeConfig writes `layer_types` out
  from `global_attn_every_n_layers` (default 4: every 4th layer full) where the config has
  none.
"""

from __future__ import annotations

from typing import Final

from hisparse_plan.presets.errors import ConfigError
from hisparse_plan.presets.families import base
from hisparse_plan.presets.regular import LayerKind

PATTERN: Final = 4
"""transformers' default `sliding_window_pattern` of Cohere2Config and Exaone4Config."""
TRANSFORMERS_DEFAULTS: Final = (
    "missing; transformers' config class defaults it; install hisparse-plan[hf] "
    "(transformers) to read this config with transformers' defaults, or add the field"
)


def read_gpt_oss(fields: base.Fields, layers: int) -> base.Layout:
    kinds: list[LayerKind] = ["sliding" if i % 2 == 0 else "full" for i in range(layers)]
    if base.given(fields, "layer_types"):
        stated = base.from_layer_types(fields, layers, base.LAYER_TYPE_KINDS, "gpt-oss")
        if stated != kinds:
            raise ConfigError(
                "layer_types: vLLM's gpt-oss code slides on even layers and not on odd ones, "
                "whatever layer_types says; this config's layer_types differs",
                field="layer_types",
            )
    return base.Layout(kinds, ("layer_types", "sliding_window"),
                  names={"attention": "model.layers.{i}.attn.attn"})


def _pattern_kinds(fields: base.Fields, layers: int, model: str) -> list[LayerKind]:
    """`layer_types`, else transformers' reading of an integer `sliding_window_pattern`."""
    if base.given(fields, "layer_types"):
        # transformers (and so vLLM) derive nothing from the pattern once layer_types is set.
        return base.from_layer_types(fields, layers, base.LAYER_TYPE_KINDS, model)
    if "sliding_window" not in fields:
        raise ConfigError(f"sliding_window: {TRANSFORMERS_DEFAULTS}", field="sliding_window")
    if fields.get("sliding_window") is None:
        return ["full"] * layers
    every = fields.get("sliding_window_pattern", PATTERN)
    if not isinstance(every, int) or isinstance(every, bool) or every < 1:
        raise ConfigError(
            f"sliding_window_pattern: {model}'s layers are read through transformers' config "
            f"class, which derives layer_types from a positive integer (every n-th layer full) "
            f"and cannot from {every!r}; expected an integer, or layer_types beside it",
            field="sliding_window_pattern",
        )
    return base.every_nth(layers, every, "full", "sliding")


UNREAD_PATTERN: Final = {"sliding_window_pattern": None}
"""The kinds are decided (`_pattern_kinds`): the pattern, whatever its type, is not read again."""


def read_cohere2(fields: base.Fields, layers: int) -> base.Layout:
    kinds = _pattern_kinds(fields, layers, "Cohere2")
    overrides: dict[str, object] = {"head_dim": None, **UNREAD_PATTERN}
    if "sliding" in kinds:
        overrides["sliding_window"] = base.positive(
            fields, "sliding_window", "Cohere2's sliding layers keep sliding_window + 1 tokens"
        ) + 1
    return base.Layout(kinds, ("layer_types", "sliding_window", "sliding_window_pattern"),
                  fields=overrides)


def read_cohere2_moe(fields: base.Fields, layers: int) -> base.Layout:
    """Cohere2-MoE (vLLM's `models/cohere2_moe.py`): Cohere2's windows (`sliding_window + 1`
    where `layer_types` slides), but heads of the config's `head_dim` where it has one."""
    kinds = _pattern_kinds(fields, layers, "Cohere2-MoE")
    overrides: dict[str, object] = dict(UNREAD_PATTERN)
    if "sliding" in kinds:
        overrides["sliding_window"] = base.positive(
            fields, "sliding_window", "Cohere2-MoE's sliding layers keep sliding_window + 1 "
            "tokens") + 1
    return base.Layout(kinds, ("layer_types", "sliding_window", "sliding_window_pattern"),
                       fields=overrides)


def read_exaone4(fields: base.Fields, layers: int) -> base.Layout:
    return base.Layout(_pattern_kinds(fields, layers, "EXAONE-4"),
                       ("layer_types", "sliding_window", "sliding_window_pattern"),
                       fields=UNREAD_PATTERN)


def read_exaone_moe(fields: base.Fields, layers: int) -> base.Layout:
    kinds = _pattern_kinds(fields, layers, "K-EXAONE")
    overrides: dict[str, object] = dict(UNREAD_PATTERN)
    if base.given(fields, "sliding_windows"):
        windows = base.layer_list(fields, "sliding_windows", layers)
        kinds = [kind if kind == "full" or windows[i] else "full" for i, kind in enumerate(kinds)]
        used = sorted({windows[i] for i, kind in enumerate(kinds) if kind == "sliding"})
        if len(used) > 1:
            raise ConfigError(
                f"sliding_windows: vLLM's K-EXAONE code gives each sliding layer its own "
                f"window; a plan here keeps one window for every sliding layer, got "
                f"{', '.join(map(str, used))}",
                field="sliding_windows",
            )
        if used:
            overrides["sliding_window"] = used[0]
    return base.Layout(kinds, ("layer_types", "sliding_window", "sliding_window_pattern"),
                       fields=overrides)


AFMOE_EVERY: Final = 4
"""transformers' default `global_attn_every_n_layers` of AfmoeConfig."""


def read_afmoe(fields: base.Fields, layers: int) -> base.Layout:
    reads = ("layer_types", "sliding_window", "global_attn_every_n_layers")
    if base.given(fields, "layer_types"):
        kinds = base.from_layer_types(fields, layers, base.LAYER_TYPE_KINDS, "AFMoE")
    else:
        every = AFMOE_EVERY if fields.get("global_attn_every_n_layers") is None else (
            base.positive(fields, "global_attn_every_n_layers",
                          "AFMoE's full layers come so often"))
        kinds = base.every_nth(layers, every, "full", "sliding")
    return base.Layout(kinds, reads)


GPT_OSS = base.Family(
    name="gpt_oss",
    model_types=("gpt_oss",),
    architectures=("GptOssForCausalLM",),
    read=read_gpt_oss,
    vllm="models/gpt_oss.py",
)
COHERE2 = base.Family(
    name="cohere2",
    model_types=("cohere2",),
    architectures=("Cohere2ForCausalLM",),
    read=read_cohere2,
    vllm="models/commandr.py",
)
COHERE2_MOE = base.Family(
    name="cohere2_moe",
    model_types=("cohere2_moe",),
    architectures=("Cohere2MoeForCausalLM",),
    read=read_cohere2_moe,
    vllm="models/cohere2_moe.py",
    sglang=base.SGLangRule(refusal="SGLang 0.5.23's srt/models/cohere2_moe.py is not yet "
                                   "checked against the SGLang target's window pools"),
)
EXAONE4 = base.Family(
    name="exaone4",
    model_types=("exaone4",),
    architectures=("Exaone4ForCausalLM",),
    read=read_exaone4,
    vllm="models/exaone4.py",
)
EXAONE_MOE = base.Family(
    name="exaone_moe",
    model_types=("exaone_moe",),
    architectures=("ExaoneMoeForCausalLM",),
    read=read_exaone_moe,
    vllm="models/exaone_moe.py",
    sglang=base.SGLangRule(refusal="SGLang 0.5.23's K-EXAONE code is not yet checked against "
                                   "the SGLang target's window pools"),
)
AFMOE = base.Family(
    name="afmoe",
    model_types=("afmoe",),
    architectures=("AfmoeForCausalLM",),
    read=read_afmoe,
    vllm="models/afmoe.py",
)
