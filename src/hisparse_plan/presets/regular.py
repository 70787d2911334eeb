"""The `config.json` fields that decide a regular (non-HiSparse) model's KV cache.

Per layer, what kind of cache it keeps, read the way vLLM 0.33's model code reads it:

- `layer_types` when the config has it: `full_attention`, `sliding_attention` (window
  `sliding_window`), `chunked_attention` (chunk `attention_chunk_size`), `linear_attention`
  (a Gated DeltaNet recurrent state);
- else `full_attention_interval` (Qwen3-Next): layer `i` is full attention when `(i + 1)` is a
  multiple of it, else linear attention;
- else `attention_chunk_size` (Llama 4): layer `i` uses chunked local attention unless it is
  a NoPE layer (`no_rope_layers[i] == 0`; without the list, every 4th layer is NoPE, as
  transformers fills it in);
- else `sliding_window_pattern` (Gemma 3): layer `i` is full attention when `(i + 1)` is a
  multiple of it, else sliding window;
- else `sliding_window` alone: every layer slides (Mistral-style); else every layer is full.

A DeepSeek-V4 config (`model_type` "deepseek_v4", or one that has `compress_ratios` or
`compress_rates`) is read as transformers' `DeepseekV4Config` hands it to vLLM: with
`layer_types` (`sliding_attention`, `compressed_sparse_attention`,
`heavily_compressed_attention`), layer `i` compresses `compress_rates[layer_types[i]]` tokens
into one state (default rates 4 and 128; none for `sliding_attention`); else by the checkpoint's
own per-layer `compress_ratios` (0 = none; entries past `num_hidden_layers` belong to the MTP
layers). Every layer keeps a sliding-window cache; ratio 4 ("csa") adds a compressed cache and
an indexer, ratio 128 ("hca") a compressed cache (see `deepseek_v4_request`).

One token of an attention layer keeps `num_key_value_heads` keys and values of `head_dim`
(else `hidden_size // num_attention_heads`) elements. A state layer's states follow `states`,
the geometry a config.json reader read for its family (`families`, `mamba_states`); without
one, a linear-attention layer is a Gated DeltaNet of the `linear_*` fields: a conv state
`[linear_conv_kernel_dim - 1, 2 * linear_num_key_heads * linear_key_head_dim +
linear_num_value_heads * linear_value_head_dim]` and a recurrent state
`[linear_num_value_heads, linear_value_head_dim, linear_key_head_dim]`.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Annotated, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from hisparse_plan.presets.layer_count import DraftLayerCount, LayerCount
from hisparse_plan.presets.mamba_states import GatedDeltaNetGeometry, StateGeometry

PositiveInt = Annotated[int, Field(ge=1)]
LayerKind = Literal[
    "full", "sliding", "chunked", "linear", "sliding_mla", "csa", "hca", "mla", "mamba",
    "full_and_mamba", "sliding_and_mamba", "conv", "none", "full_and_cross",
]
"""A decoder layer's caches. Beyond the attention kinds: `mla` a plain latent (MLA) cache,
`linear` a linear-attention state (Gated DeltaNet, KDA), `mamba` a Mamba state, `conv` a
short-convolution state (LFM2), `full_and_mamba` both a full-attention cache and a Mamba state
(a parallel hybrid layer, Falcon-H1), `sliding_and_mamba` a sliding-window cache and a state
(ZAYA1), `none` no cache at all (an MLP or MoE layer, Nemotron-H), `full_and_cross` a
full-attention cache of the decoder's own tokens and a cross-attention cache of the encoder's
output (an encoder-decoder model's decoder layer, Whisper)."""
LAYER_TYPES: Final[dict[str, LayerKind]] = {
    "full_attention": "full",
    "sliding_attention": "sliding",
    "chunked_attention": "chunked",
    "linear_attention": "linear",
}
COMPRESSED_KINDS: Final[dict[int, LayerKind]] = {1: "sliding_mla", 4: "csa", 128: "hca"}
"""A DeepSeek-V4 layer's kind by its compress ratio (vLLM 0.33 builds compressors for 4 and
128 only; 1 is a sliding-window cache alone)."""
V4_COMPRESS_RATES: Final = {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128}
"""transformers' default `compress_rates` of DeepseekV4Config."""
V4_LAYER_TYPES: Final = ("sliding_attention", *V4_COMPRESS_RATES)
STATE_ONLY_KINDS: Final[frozenset[LayerKind]] = frozenset({"mamba", "linear", "conv", "none"})
"""Kinds that keep no attention cache: a model of these alone has no heads to read."""
NOPE_INTERVAL: Final = 4
"""transformers' default `no_rope_layer_interval` for Llama 4."""
LINEAR_FIELDS: Final = (
    "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
    "linear_value_head_dim", "linear_conv_kernel_dim",
)


class LayerNames(BaseModel):
    """How vLLM names a model's cache layers: templates formatted with `i`, the decoder layer,
    `ni`, `num_hidden_layers + i` (Falcon-H1 names its Mamba mixers so), `hi`, `offset + i`,
    and `a`, layer i's attention slot (Zamba2: see `attention_slots`)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    attention: str = "model.layers.{i}.self_attn.attn"
    linear: str = "model.layers.{i}.linear_attn"
    mamba: str = "model.layers.{i}.mixer"
    conv: str = "model.layers.{i}.short_conv"
    cross: str = "model.layers.{i}.encoder_attn.attn"
    offset: int = 0
    """Added to i for `hi` (Zamba2 names layer i's mixer `{hybrid layers + i}.mixer`)."""
    attention_slots: dict[int, int] | None = None
    """Decoder layer -> the index of its attention cache where vLLM builds the attention
    caches apart from the decoder layers and before them (Zamba2's shared blocks): the
    request then lists them first, in slot order, as vLLM's model does."""
    state_first: bool = False
    """A layer with a state and an attention cache lists the state first (ZAYA1's
    `self_attn.qkv_proj` is built before its `self_attn.attn`), else the attention."""
    per_layer: list[str] | None = None
    """Each decoder layer's attention cache name, where vLLM's code names them by no single
    template (HRM-Text's recurrence steps: `families.hrm_text`); in the order vLLM builds
    them."""

    def name(self, template: str, i: int, layers: int) -> str:
        if self.per_layer is not None and template == self.attention:
            return self.per_layer[i]
        slot = (self.attention_slots or {}).get(i, i)
        return template.format(i=i, ni=layers + i, hi=self.offset + i, a=slot)


class RegularArchitecture(BaseModel):
    """The cache-shaping fields of a regular model's `config.json`; the rest is ignored."""

    model_config = ConfigDict(frozen=True, extra="ignore", strict=True)

    model_type: str | None = None
    torch_dtype: str | None = None
    dtype: str | None = None
    """The weights' dtype (`torch_dtype`, or transformers 5's `dtype`): a float16 model keeps
    float16 caches under `auto`, anything else bfloat16 (vLLM's auto dtype)."""
    num_hidden_layers: LayerCount
    num_attention_heads: PositiveInt | None
    num_key_value_heads: PositiveInt | None
    """Required fields; None only where a reader found no attention layer at all (a Mamba-1 or
    Mamba-2 model: `families.state_only`)."""
    hidden_size: PositiveInt
    head_dim: PositiveInt | None = None
    max_position_embeddings: PositiveInt
    length_assumed: bool = False
    """max_position_embeddings is vLLM's 2048 for a config that names no length, not the
    model's: a chosen max_model_len is then taken as it is (`_get_and_verify_max_len`)."""
    layer_types: list[str] | None = None
    sliding_window: PositiveInt | None = None
    sliding_window_pattern: PositiveInt | None = None
    attention_chunk_size: PositiveInt | None = None
    no_rope_layers: list[int] | None = None
    full_attention_interval: PositiveInt | None = None
    linear_num_key_heads: PositiveInt | None = None
    linear_num_value_heads: PositiveInt | None = None
    linear_key_head_dim: PositiveInt | None = None
    linear_value_head_dim: PositiveInt | None = None
    linear_conv_kernel_dim: PositiveInt | None = None
    num_nextn_predict_layers: DraftLayerCount = 0
    compress_ratios: list[Annotated[int, Field(ge=0)]] | None = None
    compress_rates: dict[str, Annotated[int, Field(ge=0)]] | None = None
    qk_rope_head_dim: PositiveInt | None = None
    index_head_dim: PositiveInt | None = None
    kv_lora_rank: PositiveInt | None = None
    kinds: list[LayerKind] | None = None
    """Each decoder layer's kind, when a config.json reader decided it (see `families`); else
    the kinds follow from the fields above."""
    states: StateGeometry | None = None
    """The state layers' geometry, when a config.json reader read it (see `mamba_states`)."""
    kv_sharing: dict[int, int] | None = None
    """Cross-layer KV sharing, when a config.json reader read it: decoder layer i reads layer
    j's attention cache and keeps none (Gemma-3n, see `families.gemma`)."""
    layer_heads: dict[int, tuple[PositiveInt, PositiveInt]] | None = None
    """Decoder layer i's (KV heads, head size) where a config.json reader found they are not
    `num_key_value_heads` and `head_dim` (Gemma-4's full layers, see `families.gemma4`)."""
    layer_names: LayerNames = LayerNames()
    encoder_tokens: PositiveInt | None = None
    """Tokens of one encoder input of an encoder-decoder model (Whisper's
    `max_source_positions`), which vLLM schedules in one step; None for a decoder-only model."""

    @property
    def auto_cache_dtype(self) -> Literal["bfloat16", "float16"]:
        """The cache dtype `auto` gives: the model's own for float16 models, else bfloat16
        (vLLM and SGLang run float32 checkpoints in bfloat16)."""
        return "float16" if (self.torch_dtype or self.dtype) == "float16" else "bfloat16"

    @property
    def compressed_mla(self) -> bool:
        """A DeepSeek-V4 model: compressed and sliding-window MLA caches."""
        return (
            self.model_type == "deepseek_v4"
            or self.compress_ratios is not None
            or self.compress_rates is not None
        )

    def compress_ratios_per_layer(self) -> list[int]:
        """Each decoder layer's compress ratio as vLLM 0.33 reads it (1: sliding window only)."""
        layers = range(self.num_hidden_layers)
        if self.layer_types is not None:
            rates = self.compress_rates or V4_COMPRESS_RATES
            return [max(1, rates.get(self.layer_types[i], 0)) for i in layers]
        ratios = self.compress_ratios or []
        return [max(1, ratios[i]) for i in layers]

    @model_validator(mode="after")
    def _kinds_are_complete(self) -> RegularArchitecture:
        if self.compressed_mla:
            return self._compressed_kinds_are_complete()
        # A reader's kinds came from layer_types values its family's code knows.
        self._one_entry_per_layer(("layer_types", "no_rope_layers", "kinds"),
                                  LAYER_TYPES if self.kinds is None else None)
        kinds = set(self.layer_kinds())
        if "mla" in kinds and (self.kv_lora_rank is None or self.qk_rope_head_dim is None):
            raise ValueError(
                "kv_lora_rank: MLA layers keep kv_lora_rank + qk_rope_head_dim latent elements; "
                "expected both"
            )
        if kinds & {"mamba", "full_and_mamba", "sliding_and_mamba", "conv"} and (
                self.states is None):
            raise ValueError("states: Mamba and short-convolution layers need their state "
                             "geometry; got none")
        if kinds & {"sliding", "sliding_and_mamba"} and self.sliding_window is None:
            raise ValueError("sliding_window: sliding-window layers need it; got none")
        if "chunked" in kinds and self.attention_chunk_size is None:
            raise ValueError("attention_chunk_size: chunked layers need it; got none")
        if "linear" in kinds and self.states is None:
            missing = [name for name in LINEAR_FIELDS if getattr(self, name) is None]
            if missing:
                raise ValueError(
                    f"{missing[0]}: linear-attention layers need {', '.join(LINEAR_FIELDS)}; "
                    f"missing {', '.join(missing)}"
                )
        return self

    def _one_entry_per_layer(
        self, names: tuple[str, ...], layer_types: Collection[str] | None
    ) -> None:
        """Each of the per-layer lists `names` covers every layer; layer_types are known (of
        `layer_types`, unless None)."""
        layers = self.num_hidden_layers
        for name in names:
            values = getattr(self, name)
            if values is not None and len(values) < layers:
                raise ValueError(
                    f"{name}: expected an entry for each of the {layers} layers, got {len(values)}"
                )
        if self.layer_types is not None and layer_types is not None:
            unknown = sorted(set(self.layer_types[:layers]) - set(layer_types))
            if unknown:
                raise ValueError(
                    f"layer_types: expected {', '.join(layer_types)}, got {', '.join(unknown)}"
                )

    def _compressed_kinds_are_complete(self) -> RegularArchitecture:
        if self.layer_types is None and self.compress_ratios is None:
            raise ValueError(
                "compress_ratios: a DeepSeek-V4 config needs it or layer_types; got neither"
            )
        self._one_entry_per_layer(("layer_types", "compress_ratios"), V4_LAYER_TYPES)
        odd = sorted(set(self.compress_ratios_per_layer()) - set(COMPRESSED_KINDS))
        if odd:
            raise ValueError(
                f"compress_ratios: expected 0, 4 or 128 (the compressors vLLM 0.33 builds), got "
                f"{', '.join(map(str, odd))}"
            )
        for name in ("sliding_window", "qk_rope_head_dim", "head_dim"):
            if getattr(self, name) is None:
                raise ValueError(f"{name}: a DeepSeek-V4 config needs it; got none")
        if "csa" in self.layer_kinds() and self.index_head_dim is None:
            raise ValueError("index_head_dim: ratio-4 layers have an indexer; got none")
        return self

    @model_validator(mode="after")
    def _heads_have_a_size(self) -> RegularArchitecture:
        """Without head_dim a head is hidden_size / num_attention_heads wide: at least 1. Only
        a model without attention layers may have no heads."""
        if self.num_attention_heads is None or self.num_key_value_heads is None:
            if set(self.layer_kinds()) - STATE_ONLY_KINDS:
                raise ValueError("num_attention_heads: attention layers need their heads and "
                                 "num_key_value_heads; got none")
            return self
        if self.head_dim is None and self.num_attention_heads > self.hidden_size:
            raise ValueError(
                f"num_attention_heads: without head_dim a head is hidden_size / "
                f"num_attention_heads wide; expected at most hidden_size ({self.hidden_size}) "
                f"heads, got {self.num_attention_heads}"
            )
        return self

    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden_size // self.attention_heads

    @property
    def attention_heads(self) -> int:
        """`num_attention_heads` of a model with attention layers (the validator's promise)."""
        if self.num_attention_heads is None:
            raise ValueError("num_attention_heads: a model without attention has no heads")
        return self.num_attention_heads

    @property
    def kv_heads(self) -> int:
        """`num_key_value_heads` of a model with attention layers (the validator's promise)."""
        if self.num_key_value_heads is None:
            raise ValueError("num_key_value_heads: a model without attention has no KV heads")
        return self.num_key_value_heads

    def layer_kinds(self) -> list[LayerKind]:
        """Each decoder layer's cache kind, in model order."""
        layers = range(self.num_hidden_layers)
        if self.compressed_mla:
            return [COMPRESSED_KINDS[ratio] for ratio in self.compress_ratios_per_layer()]
        if self.kinds is not None:
            return self.kinds[: self.num_hidden_layers]
        if self.layer_types is not None:
            return [LAYER_TYPES[self.layer_types[i]] for i in layers]
        if self.full_attention_interval is not None:
            every = self.full_attention_interval
            return ["full" if (i + 1) % every == 0 else "linear" for i in layers]
        if self.attention_chunk_size is not None:
            nope = self.no_rope_layers or [
                int((i + 1) % NOPE_INTERVAL != 0) for i in layers
            ]
            return ["full" if nope[i] == 0 else "chunked" for i in layers]
        if self.sliding_window_pattern is not None:
            every = self.sliding_window_pattern
            return ["full" if (i + 1) % every == 0 else "sliding" for i in layers]
        return ["sliding" if self.sliding_window is not None else "full" for _ in layers]

    def state_geometry(self) -> StateGeometry | None:
        """The state layers' geometry: the one read for the model's family, else the Gated
        DeltaNet of the `linear_*` fields when some layer is linear attention (a preset)."""
        if self.states is not None or "linear" not in self.layer_kinds():
            return self.states
        return GatedDeltaNetGeometry(
            num_key_heads=self.linear_num_key_heads or 1,
            num_value_heads=self.linear_num_value_heads or 1,
            key_head_dim=self.linear_key_head_dim or 1,
            value_head_dim=self.linear_value_head_dim or 1,
            conv_kernel=self.linear_conv_kernel_dim or 1,
            source="linear_*",
        )
