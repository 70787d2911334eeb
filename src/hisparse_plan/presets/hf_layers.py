"""Each decoder layer's kind, read from a (text) `config.json` the way vLLM 0.34's model code
for its architecture lays the layers out.

vLLM's rules, by `model_type`:

- DeepSeek-V2/V3/R1, Kimi-K2 (`deepseek_v2`, `deepseek_v3`, `kimi_k2`): every layer a plain
  MLA latent cache (`kv_lora_rank` + `qk_rope_head_dim` elements);
- Jamba: layer `i` is attention when `i % attn_layer_period == attn_layer_offset`, else Mamba-1;
- Nemotron-H: `hybrid_override_pattern`, one character a layer: `M` Mamba-2, `*` attention,
  `-` MLP and `E` MoE (no cache);
- Falcon-H1: every layer runs attention and a Mamba-2 mixer side by side (both caches);
- Qwen3-Next: `layer_types` (`full_attention` / `linear_attention`), else every
  `full_attention_interval`-th layer full, the rest Gated DeltaNet;
- gpt-oss: even layers slide (`sliding_window`), odd ones are full, whatever `layer_types` says
  (a `layer_types` that disagrees is refused);
- Gemma-2 / Gemma-3: `layer_types`, else Gemma-2 alternates (even layers slide) and Gemma-3
  slides except every `sliding_window_pattern`-th layer (default 6);
- Llama-4: a NoPE layer (`no_rope_layers[i] == 0`, default every 4th) is full attention, the
  rest chunked local (`attention_chunk_size`);
- Qwen2 / Qwen3 (dense, MoE, VL): vLLM gives every layer the model-wide window, so the layers
  all slide (`use_sliding_window` and `max_window_layers` 0) or none does; a window on only
  some layers (`max_window_layers` below the layer count) is refused, as vLLM refuses it;
- anything else (Llama, Mistral, Mixtral, Phi-3, ...): `layer_types` (`full_attention` /
  `sliding_attention`), else every layer slides when `sliding_window` is set, else all full.

MiniMax-M1 / Text-01 (`attn_type_list`) are refused: vLLM 0.34 no longer serves them. A field
that changes layer kinds in some architecture (`MARKERS`) but is not read by this one's rule is
refused, naming it: a plan must never be silently wrong about a layer's kind.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from hisparse_plan.models.dtypes import DTYPE_SIZE
from hisparse_plan.presets.errors import ConfigError
from hisparse_plan.presets.mamba_states import MambaGeometry
from hisparse_plan.presets.regular import LayerKind

Fields = Mapping[str, Any]

MARKERS: Final = (
    "layer_types", "layers_block_type", "attn_type_list", "attn_layer_period",
    "attn_layer_offset", "hybrid_override_pattern", "full_attention_interval",
    "sliding_window_pattern", "use_sliding_window", "max_window_layers", "no_rope_layers",
    "attention_chunk_size", "sliding_window", "interleaved_sliding_window", "block_configs",
    "linear_attn_config", "attn_layer_indices", "mamba_layers", "global_attn_every_n_layers",
    "swa_layers", "hybrid_layer_ids", "kv_lora_rank", "layer_block_types",
)
"""Config fields that decide which kind of cache some layer keeps, in some architecture."""
MLA_TYPES: Final = frozenset({"deepseek_v2", "deepseek_v3", "kimi_k2"})
QWEN_TYPES: Final = frozenset({
    "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "qwen2_vl", "qwen2_vl_text", "qwen2_5_vl",
    "qwen2_5_vl_text",
})
GEMMA3_PATTERN: Final = 6
"""transformers' default `sliding_window_pattern` for Gemma-3."""
NOPE_INTERVAL: Final = 4
"""transformers' default `no_rope_layer_interval` for Llama-4."""
NEMOTRON_H_SSM_DTYPE: Final = "float32"
"""vLLM's default Mamba state dtype for Nemotron-H (NemotronHForCausalLMConfig)."""
NEMOTRON_H_KINDS: Final[dict[str, LayerKind]] = {"M": "mamba", "*": "full", "-": "none",
                                                 "E": "none"}
NEMOTRON_H_TYPES: Final[dict[str, LayerKind]] = {
    "mamba": "mamba", "attention": "full", "full_attention": "full", "mlp": "none",
    "moe": "none", "linear_attention": "mamba",
}
LAYER_TYPE_KINDS: Final[dict[str, LayerKind]] = {
    "full_attention": "full", "sliding_attention": "sliding",
}


class Layout:
    """The kinds one architecture's rule gives, and the markers that rule reads."""

    def __init__(self, kinds: list[LayerKind], reads: tuple[str, ...],
                 mamba: MambaGeometry | None = None, names: Mapping[str, str] | None = None
                 ) -> None:
        self.kinds, self.reads, self.mamba = kinds, reads, mamba
        self.names: Mapping[str, str] = names or {}
        """`LayerNames` templates where vLLM's code for the model names layers otherwise."""


def _given(fields: Fields, name: str) -> bool:
    """Whether `name` is set to something that could change a kind (not null, false or empty)."""
    value = fields.get(name)
    return value is not None and value is not False and value != [] and value != ""


def _int(fields: Fields, name: str, why: str) -> int:
    value = fields.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigError(f"{name}: {why}; expected a non-negative integer, got {value!r}",
                          field=name)
    return value


def _layer_list(fields: Fields, name: str, layers: int) -> list[Any]:
    value = fields.get(name)
    if not isinstance(value, (list, str)) or len(value) < layers:
        got = len(value) if isinstance(value, (list, str)) else repr(value)
        raise ConfigError(
            f"{name}: expected an entry for each of the {layers} layers, got {got}", field=name
        )
    return list(value[:layers])


def _from_layer_types(fields: Fields, layers: int, kinds: Mapping[str, LayerKind],
                      model: str) -> list[LayerKind]:
    values = _layer_list(fields, "layer_types", layers)
    unknown = sorted({str(v) for v in values} - set(kinds))
    if unknown:
        raise ConfigError(
            f"layer_types: {model} layers are {', '.join(kinds)} in vLLM's model code; got "
            f"{', '.join(unknown)}",
            field="layer_types",
        )
    return [kinds[v] for v in values]


def _mla(fields: Fields, layers: int) -> Layout:
    return Layout(["mla"] * layers, ("kv_lora_rank",))


def _jamba(fields: Fields, layers: int) -> Layout:
    period = _int(fields, "attn_layer_period", "Jamba's attention layer period")
    offset = _int(fields, "attn_layer_offset", "Jamba's attention layer offset")
    if period == 0 or offset >= period:
        raise ConfigError(
            f"attn_layer_offset: expected below attn_layer_period ({period}), got {offset}",
            field="attn_layer_offset",
        )
    kinds: list[LayerKind] = ["full" if i % period == offset else "mamba" for i in range(layers)]
    hidden = _int(fields, "hidden_size", "Jamba's Mamba width is mamba_expand x hidden_size")
    geometry = MambaGeometry(
        version=1,
        intermediate_size=_int(fields, "mamba_expand", "Jamba's Mamba expansion") * hidden,
        state_size=_int(fields, "mamba_d_state", "Jamba's Mamba state size"),
        conv_kernel=_int(fields, "mamba_d_conv", "Jamba's Mamba conv kernel"),
        source="mamba_expand, mamba_d_state, mamba_d_conv",
    )
    return Layout(kinds, ("attn_layer_period", "attn_layer_offset", "layers_block_type",
                          "layer_types", "sliding_window"), geometry,
                  {"attention": "model.layers.{i}.attn"})


def _nemotron_h(fields: Fields, layers: int) -> Layout:
    if _given(fields, "hybrid_override_pattern"):
        pattern = _layer_list(fields, "hybrid_override_pattern", layers)
        odd = sorted(set(pattern) - set(NEMOTRON_H_KINDS))
        if odd:
            raise ConfigError(
                f"hybrid_override_pattern: expected M (Mamba), * (attention), - (MLP) or E "
                f"(MoE) per layer, got {', '.join(odd)}",
                field="hybrid_override_pattern",
            )
        kinds = [NEMOTRON_H_KINDS[c] for c in pattern]
    else:
        kinds = _from_layer_types(fields, layers, NEMOTRON_H_TYPES, "Nemotron-H")
    heads = _int(fields, "mamba_num_heads", "Nemotron-H's Mamba heads")
    head_dim = _int(fields, "mamba_head_dim", "Nemotron-H's Mamba head size")
    ssm_dtype = fields.get("mamba_ssm_cache_dtype") or NEMOTRON_H_SSM_DTYPE
    if ssm_dtype not in DTYPE_SIZE:
        raise ConfigError(
            f"mamba_ssm_cache_dtype: expected one of {', '.join(DTYPE_SIZE)}, got {ssm_dtype!r}",
            field="mamba_ssm_cache_dtype",
        )
    geometry = MambaGeometry.model_validate({
        "version": 2,
        "intermediate_size": heads * head_dim,
        "n_groups": _int(fields, "n_groups", "Nemotron-H's Mamba groups"),
        "num_heads": heads,
        "head_dim": head_dim,
        "state_size": _int(fields, "ssm_state_size", "Nemotron-H's Mamba state size"),
        "conv_kernel": _int(fields, "conv_kernel", "Nemotron-H's Mamba conv kernel"),
        "ssm_dtype": ssm_dtype,
        "source": "mamba_num_heads, mamba_head_dim, n_groups, ssm_state_size, conv_kernel",
    })
    return Layout(kinds, ("hybrid_override_pattern", "layer_types", "layers_block_type",
                          "sliding_window"), geometry,
                  {"attention": "model.layers.{i}.mixer.attn"})


def _falcon_h1(fields: Fields, layers: int) -> Layout:
    d_ssm = fields.get("mamba_d_ssm")
    intermediate = (
        d_ssm if isinstance(d_ssm, int) and d_ssm > 0
        else _int(fields, "mamba_expand", "Falcon-H1's Mamba width without mamba_d_ssm")
        * _int(fields, "hidden_size", "Falcon-H1's Mamba width")
    )
    geometry = MambaGeometry(
        version=2,
        intermediate_size=intermediate,
        n_groups=_int(fields, "mamba_n_groups", "Falcon-H1's Mamba groups"),
        num_heads=_int(fields, "mamba_n_heads", "Falcon-H1's Mamba heads"),
        head_dim=_int(fields, "mamba_d_head", "Falcon-H1's Mamba head size"),
        state_size=_int(fields, "mamba_d_state", "Falcon-H1's Mamba state size"),
        conv_kernel=_int(fields, "mamba_d_conv", "Falcon-H1's Mamba conv kernel"),
        source="mamba_d_ssm, mamba_n_groups, mamba_n_heads, mamba_d_head, mamba_d_state",
    )
    # vLLM names the Mamba mixer of layer i `model.{num_hidden_layers + i}.mixer`.
    return Layout(["full_and_mamba"] * layers, ("layers_block_type", "layer_types",
                                               "sliding_window"), geometry,
                  {"attention": "model.layers.{i}.attn", "mamba": "model.{ni}.mixer"})


def _qwen3_next(fields: Fields, layers: int) -> Layout:
    reads = ("layer_types", "full_attention_interval", "sliding_window")
    if _given(fields, "layer_types"):
        kinds = _from_layer_types(
            fields, layers, {"full_attention": "full", "linear_attention": "linear"}, "Qwen3-Next"
        )
        return Layout(kinds, reads)
    every = _int(fields, "full_attention_interval", "Qwen3-Next's full-attention interval")
    if every == 0:
        raise ConfigError("full_attention_interval: expected at least 1, got 0",
                          field="full_attention_interval")
    return Layout(["full" if (i + 1) % every == 0 else "linear" for i in range(layers)], reads)


def _gpt_oss(fields: Fields, layers: int) -> Layout:
    kinds: list[LayerKind] = ["sliding" if i % 2 == 0 else "full" for i in range(layers)]
    if _given(fields, "layer_types"):
        given = _from_layer_types(fields, layers, LAYER_TYPE_KINDS, "gpt-oss")
        if given != kinds:
            raise ConfigError(
                "layer_types: vLLM's gpt-oss code slides on even layers and not on odd ones, "
                "whatever layer_types says; this config's layer_types differs",
                field="layer_types",
            )
    return Layout(kinds, ("layer_types", "sliding_window"),
                  names={"attention": "model.layers.{i}.attn.attn"})


def _gemma(fields: Fields, layers: int) -> Layout:
    reads = ("layer_types", "sliding_window", "sliding_window_pattern")
    if _given(fields, "layer_types"):
        return Layout(_from_layer_types(fields, layers, LAYER_TYPE_KINDS, "Gemma"), reads)
    if fields.get("model_type") == "gemma2":
        return Layout(["sliding" if i % 2 == 0 else "full" for i in range(layers)], reads)
    every = fields.get("sliding_window_pattern", GEMMA3_PATTERN)
    if not isinstance(every, int) or every < 1:
        raise ConfigError(f"sliding_window_pattern: expected a positive integer, got {every!r}",
                          field="sliding_window_pattern")
    return Layout(["full" if (i + 1) % every == 0 else "sliding" for i in range(layers)], reads)


def _llama4(fields: Fields, layers: int) -> Layout:
    reads = ("attention_chunk_size", "no_rope_layers", "layer_types", "sliding_window")
    interval = fields.get("no_rope_layer_interval", NOPE_INTERVAL)
    nope = (
        _layer_list(fields, "no_rope_layers", layers) if _given(fields, "no_rope_layers")
        else [int((i + 1) % interval != 0) for i in range(layers)]
    )
    chunked = _given(fields, "attention_chunk_size")
    kinds: list[LayerKind] = [
        "chunked" if chunked and nope[i] != 0 else "full" for i in range(layers)
    ]
    if _given(fields, "layer_types"):
        given = _from_layer_types(
            fields, layers, {"full_attention": "full", "chunked_attention": "chunked"}, "Llama-4"
        )
        if given != kinds:
            raise ConfigError(
                "layer_types: vLLM's Llama-4 code chunks every RoPE layer (no_rope_layers) when "
                "attention_chunk_size is set; this config's layer_types differs",
                field="layer_types",
            )
    return Layout(kinds, reads)


def _qwen(fields: Fields, layers: int) -> Layout:
    reads = ("layer_types", "sliding_window", "use_sliding_window", "max_window_layers")
    if _given(fields, "layer_types"):
        sliding = [k == "sliding" for k in
                   _from_layer_types(fields, layers, LAYER_TYPE_KINDS, "Qwen")]
    else:
        first = fields.get("max_window_layers", layers)
        on = _given(fields, "use_sliding_window") and _given(fields, "sliding_window")
        sliding = [bool(on) and i >= first for i in range(layers)]
    if any(sliding) and not all(sliding):
        raise ConfigError(
            f"max_window_layers: a sliding window on layers {sliding.index(True)} and up only; "
            "vLLM's Qwen code gives every layer the model's one window and refuses this",
            field="max_window_layers",
        )
    return Layout(["sliding" if all(sliding) else "full"] * layers, reads)


def _generic(fields: Fields, layers: int) -> Layout:
    reads = ("layer_types", "sliding_window")
    if _given(fields, "layer_types"):
        return Layout(_from_layer_types(fields, layers, LAYER_TYPE_KINDS, "this model's"), reads)
    kind: LayerKind = "sliding" if _given(fields, "sliding_window") else "full"
    return Layout([kind] * layers, reads)


def _minimax(fields: Fields, layers: int) -> Layout:
    field = "attn_type_list" if _given(fields, "attn_type_list") else "layer_types"
    raise ConfigError(
        f"{field}: MiniMax lightning-attention hybrids (MiniMax-M1, MiniMax-Text-01) are not "
        "served by vLLM 0.34 (removed in 0.23), so there is no layer layout to plan",
        field=field,
    )


RULES: Final[dict[str, Callable[[Fields, int], Layout]]] = {
    **dict.fromkeys(MLA_TYPES, _mla),
    "jamba": _jamba,
    "nemotron_h": _nemotron_h,
    "falcon_h1": _falcon_h1,
    "qwen3_next": _qwen3_next,
    "gpt_oss": _gpt_oss,
    "gemma2": _gemma, "gemma3": _gemma, "gemma3_text": _gemma,
    "llama4": _llama4, "llama4_text": _llama4,
    **dict.fromkeys(QWEN_TYPES, _qwen),
    "minimax": _minimax, "minimax_m1": _minimax, "minimax_text_01": _minimax,
}


def layer_layout(fields: Fields, layers: int) -> Layout:
    """The kinds of the `layers` decoder layers, refusing any kind-changing field the model's
    rule does not read."""
    model_type = str(fields.get("model_type") or "")
    if _given(fields, "attn_type_list"):
        return _minimax(fields, layers)
    rule = RULES.get(model_type, _generic)
    layout = rule(fields, layers)
    unread = [name for name in MARKERS if name not in layout.reads and _given(fields, name)]
    if unread:
        name = unread[0]
        who = f"model_type {model_type!r}" if model_type else "a config without model_type"
        raise ConfigError(
            f"{name}: it decides layer kinds in some architectures, but vLLM's code for {who} "
            f"does not read it as planned here; refusing rather than guessing the layers' kinds",
            field=name,
        )
    return layout
