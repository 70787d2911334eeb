"""The few `config.json` fields that decide a sparse-MLA model's KV cache.

A Hugging Face `config.json` carries hundreds of fields; these are the ones the cache depends on:

- `num_hidden_layers`: how many attention layers there are (MTP / next-n layers are not
  counted here: see `num_nextn_predict_layers`);
- `kv_lora_rank` and `qk_rope_head_dim`: one token's latent row is `kv_lora_rank` compressed
  elements followed by `qk_rope_head_dim` rotary elements;
- `index_head_dim`: one token's indexer key;
- `index_topk`: how many past tokens the indexer selects;
- `max_position_embeddings`: the longest context, the default `max_model_len`;
- `num_nextn_predict_layers`: MTP draft layers, planned only when speculative decoding by MTP
  is chosen;
- which layers run their own indexer: `indexer_types` (`"full"` / `"shared"` per layer), else
  `index_topk_pattern` (`"F"` / `"S"` per layer), else `index_topk_freq` with
  `index_skip_topk_offset`, read the way vLLM reads them: layer `i` runs an indexer when
  `max(i - offset + 1, 0) % freq == 0` (offset 2 when absent, freq 1 when absent, so every
  layer runs one).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from hisparse_plan.presets.layer_count import DraftLayerCount, LayerCount

PositiveInt = Annotated[int, Field(ge=1)]

DEFAULT_SKIP_TOPK_OFFSET = 2
"""vLLM's default for `index_skip_topk_offset` when a config sets only `index_topk_freq`."""


class ModelArchitecture(BaseModel):
    """The cache-shaping fields of a model's `config.json`; every other field is ignored."""

    model_config = ConfigDict(frozen=True, extra="ignore", strict=True)

    model_type: str | None = None
    num_hidden_layers: LayerCount
    kv_lora_rank: PositiveInt
    qk_rope_head_dim: PositiveInt
    index_head_dim: PositiveInt
    index_topk: PositiveInt
    max_position_embeddings: PositiveInt
    index_topk_freq: PositiveInt = 1
    index_skip_topk_offset: Annotated[int, Field(ge=0)] = DEFAULT_SKIP_TOPK_OFFSET
    index_topk_pattern: str | None = None
    indexer_types: list[Literal["full", "shared"]] | None = None
    num_nextn_predict_layers: DraftLayerCount = 0

    @model_validator(mode="after")
    def _one_indexer_per_leader(self) -> ModelArchitecture:
        layers = self.num_hidden_layers
        if self.indexer_types is not None and len(self.indexer_types) < layers:
            raise ValueError(
                f"indexer_types: expected an entry for each of the {layers} layers, got "
                f"{len(self.indexer_types)}"
            )
        if self.indexer_types is None and self.index_topk_pattern is not None:
            pattern = self.index_topk_pattern
            if len(pattern) < layers or set(pattern.upper()) - {"F", "S"}:
                raise ValueError(
                    f"index_topk_pattern: expected one 'F' (own indexer) or 'S' (shared) per "
                    f"layer, {layers} in all, got {pattern!r}"
                )
        if not self.leaders()[0]:
            raise ValueError(
                f"{self.sharing_source}: layer 0 must run its own indexer (a layer that shares "
                "top-k needs an earlier layer to share it from)"
            )
        return self

    @property
    def sharing_source(self) -> str:
        """The config field that decides which layers run an indexer."""
        if self.indexer_types is not None:
            return "indexer_types"
        if self.index_topk_pattern is not None:
            return "index_topk_pattern"
        return "index_topk_freq"

    def leaders(self) -> list[bool]:
        """For each layer, whether it runs its own indexer (and so has an indexer cache)."""
        layers = range(self.num_hidden_layers)
        if self.indexer_types is not None:
            return [self.indexer_types[i] == "full" for i in layers]
        if self.index_topk_pattern is not None:
            return [self.index_topk_pattern[i].upper() == "F" for i in layers]
        freq, offset = self.index_topk_freq, self.index_skip_topk_offset
        return [max(i - offset + 1, 0) % freq == 0 for i in layers]
