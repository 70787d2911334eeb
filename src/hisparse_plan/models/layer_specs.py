"""How one layer stores its cache (see docs/planning-rules.md#requests, #pages).

Every kind knows its page's logical shape `[H, N, C]` (heads, stored states per block, content
bytes of one state of one head), its natural page `H * N * C`, and its page: the padded page
where it has one, else the natural page. `page_size_bytes` is derived from those and checked
when given. A page of 0 bytes or a padding below the natural page validates (the planner refuses
them with a PlanError naming the layer, see docs/planning-rules.md#pages).
"""

from __future__ import annotations

from math import prod
from typing import Annotated, Literal

from pydantic import Field, Tag

from hisparse_plan.models.base import (
    BY_KIND,
    READ_ONLY,
    ByteCount,
    LayerName,
    Model,
    PositiveInt,
    is_none,
)
from hisparse_plan.models.derived import store_derived
from hisparse_plan.models.dtypes import DTYPE_SIZE, DType, dtype_size

_PAGE_DOC = "Derived: the padded page if the layer has one, else H * N * C. Checked if given."
_ALIGN_DOC = "The stride between two blocks of this layer must be a multiple of this (see "
"docs/planning-rules.md#device-pool)."
_DCP_DOC = (
    "Decode context parallelism shards this layer's token positions across the DCP ranks "
    "(vLLM's AttentionSpec.dcp_sharded); false for a replicated cache such as a draft model's."
)
_SHARING_DOC = (
    "Cross-layer KV sharing: the layer whose cache this layer reads (vLLM's "
    "kv_sharing_target_layer_name). It keeps no pages of its own (see "
    "docs/plan-contract.md#cross-layer-kv-sharing); left out of the JSON when null."
)
_PADDED_DOC = (
    "The page is this many bytes (>= the natural page): set by the engine (Mamba) or by the "
    "planner when it pads pages to one size (see docs/planning-rules.md#unified-pages)."
)


class LayerSpecBase(Model):
    """Fields and page arithmetic every kind shares."""

    kind: str
    block_size: PositiveInt = Field(description="Tokens one block covers.")
    block_stride_alignment: PositiveInt | None = Field(default=None, description=_ALIGN_DOC)
    page_size_bytes: ByteCount = Field(default=0, description=_PAGE_DOC)

    @property
    def heads(self) -> int:
        """H: heads stored per token position."""
        return 1

    @property
    def tokens_per_block(self) -> int:
        """N: states one block stores."""
        return 1

    @property
    def content_bytes(self) -> int:
        """C: bytes of one stored state of one head."""
        raise NotImplementedError

    @property
    def view_dtype(self) -> DType:
        """The element type a view of this layer's pages is taken in."""
        return "uint8"

    @property
    def natural_page_bytes(self) -> int:
        return self.heads * self.tokens_per_block * self.content_bytes

    @property
    def padded_page_bytes(self) -> int | None:
        """The padded page (see docs/planning-rules.md#pages); None when the layer has none."""
        return self._padded(self.natural_page_bytes)

    def _padded(self, natural: int) -> int | None:
        """The padded page of a layer whose natural page is `natural`."""
        return None

    @property
    def has_padded_page(self) -> bool:
        return self.padded_page_bytes is not None

    @property
    def align(self) -> int:
        """align(layer) of docs/planning-rules.md#pages."""
        return 1 if self.block_stride_alignment is None else self.block_stride_alignment

    def model_post_init(self, context: object, /) -> None:
        self._derive()

    def _derive(self) -> None:
        natural = self.natural_page_bytes
        padded = self._padded(natural)
        page = natural if padded is None else padded
        store_derived(self, "page_size_bytes", page, "the padded page, else H * N * C")


class AttentionLayerSpec(LayerSpecBase):
    """A layer that stores `num_kv_heads` rows of `head_size` elements per stored token."""

    head_size: PositiveInt = Field(description="Elements of one head's row (K for K/V layers).")
    dtype: DType = Field(default="bfloat16", description="What the cache tensor holds.")
    num_kv_heads: PositiveInt = Field(default=1, description="KV heads this rank keeps.")
    page_size_padded: PositiveInt | None = Field(default=None, description=_PADDED_DOC)
    dcp_sharded: bool = Field(default=True, description=_DCP_DOC)
    kv_sharing_target: LayerName | None = Field(
        default=None, exclude_if=is_none, description=_SHARING_DOC
    )

    @property
    def dtype_size(self) -> int:
        return DTYPE_SIZE[self.dtype]

    @property
    def heads(self) -> int:
        return self.num_kv_heads

    @property
    def tokens_per_block(self) -> int:
        return self.block_size

    @property
    def view_dtype(self) -> DType:
        return self.dtype

    def _padded(self, natural: int) -> int | None:
        return self.page_size_padded


class LatentLayerSpec(AttentionLayerSpec):
    """One latent vector per token (MLA): `state_content_bytes`, else `head_size` elements.

    `compress_ratio` tokens fold into one stored state; `alignment` pads the page.
    """

    cache_dtype: str | None = Field(
        default=None, description="The engine's cache format name, e.g. fp8_ds_mla."
    )
    state_content_bytes: PositiveInt | None = Field(
        default=None, description="Bytes of one packed token row (e.g. 656 for fp8_ds_mla)."
    )
    model_version: str | None = Field(
        default=None, description="A model family whose cache has its own rules (deepseek_v4)."
    )
    compress_ratio: PositiveInt = Field(
        default=1, description="Tokens folded into one stored state."
    )
    alignment: PositiveInt | None = Field(
        default=None, description="The page is padded up to a multiple of this many bytes."
    )

    @property
    def tokens_per_block(self) -> int:
        return self.block_size // self.compress_ratio

    @property
    def content_bytes(self) -> int:
        if self.state_content_bytes is not None:
            return self.state_content_bytes
        return self.head_size * self.dtype_size

    def _padded(self, natural: int) -> int | None:
        if self.page_size_padded is not None:
            return self.page_size_padded
        if self.alignment is None or natural % self.alignment == 0:
            return None
        return -(-natural // self.alignment) * self.alignment

    def _derive(self) -> None:
        if self.state_content_bytes is not None and self.state_content_bytes % self.dtype_size:
            raise ValueError(
                f"state_content_bytes: expected a multiple of the {self.dtype} size "
                f"{self.dtype_size}, got {self.state_content_bytes}"
            )
        super()._derive()


class MLASpec(LatentLayerSpec):
    """A multi-head latent attention layer: a sparse (source) layer or an indexer's keys.

    `sliding_window` is set only on a sliding_window_mla layer promoted to full allocation (the
    full-allocation fallback, or the hybrid manager disabled): it keeps full blocks."""

    kind: Literal["mla"] = "mla"
    cache_role: Literal["sparse", "indexer"] = Field(
        default="sparse",
        description="sparse: the latent rows (HiSparse's source); indexer: the indexer keys.",
    )
    is_index_group_leader: bool = Field(
        default=False, description="This layer runs its own indexer (starts a hot unit)."
    )
    topk_buffer_width: PositiveInt | None = Field(
        default=None, description="Top-k rows this layer reads; null: the model's index_topk."
    )
    sliding_window: PositiveInt | None = Field(
        default=None, description="Set only on a sliding-window layer promoted to full blocks."
    )


class SlidingWindowMLASpec(LatentLayerSpec):
    """A latent cache that keeps only the last `sliding_window` tokens (DeepSeek-V4)."""

    kind: Literal["sliding_window_mla"] = "sliding_window_mla"
    sliding_window: PositiveInt = Field(description="Tokens of the window.")
    model_version: Literal["deepseek_v4"] | None = Field(
        default=None, description="deepseek_v4 for DeepSeek-V4's caches."
    )


class KVLayerSpec(AttentionLayerSpec):
    """A layer with separate K and V rows of `head_size` and `head_size_v` elements."""

    num_kv_heads: PositiveInt = Field(description="KV heads this rank keeps.")
    head_size_v: PositiveInt | None = Field(default=None, description="Defaults to head_size.")

    @property
    def value_head_size(self) -> int:
        return self.head_size if self.head_size_v is None else self.head_size_v

    @property
    def content_bytes(self) -> int:
        return (self.head_size + self.value_head_size) * self.dtype_size

    def _derive(self) -> None:
        if self.head_size_v is None:
            object.__setattr__(self, "head_size_v", self.head_size)
        super()._derive()


class FullAttentionSpec(KVLayerSpec):
    """Every past token's K and V. `sliding_window` / `attention_chunk_size` are set only on a
    sliding-window / chunked-local layer promoted to full allocation (the full-allocation
    fallback, or the hybrid manager disabled): it keeps full blocks and remembers its window."""

    kind: Literal["full_attention"] = "full_attention"
    sliding_window: PositiveInt | None = Field(
        default=None, description="The window of a promoted sliding-window layer."
    )
    attention_chunk_size: PositiveInt | None = Field(
        default=None, description="The chunk of a promoted chunked-local layer."
    )


class SlidingWindowSpec(KVLayerSpec):
    """K and V of the last `sliding_window` tokens (and a drafter's extra tokens)."""

    kind: Literal["sliding_window"] = "sliding_window"
    sliding_window: PositiveInt = Field(description="Tokens of the window.")


class ChunkedLocalAttentionSpec(KVLayerSpec):
    """K and V of the current `attention_chunk_size`-token chunk (Llama 4's local layers)."""

    kind: Literal["chunked_local_attention"] = "chunked_local_attention"
    attention_chunk_size: PositiveInt = Field(description="Tokens of one attention chunk.")


class CrossAttentionSpec(KVLayerSpec):
    """K and V of the encoder's output that an encoder-decoder model's decoder layer attends to
    (Whisper's `encoder_attn`; vLLM's CrossAttentionSpec). Its blocks live in a block table of
    their own, sized by the encoder's tokens rather than the request's length (see
    docs/planning-rules.md#cross-attention)."""

    kind: Literal["cross_attention"] = "cross_attention"


StateShape = Annotated[list[PositiveInt], Field(min_length=1), READ_ONLY]


class MambaSpec(LayerSpecBase):
    """Recurrent states (Mamba, linear attention): one block holds every state of a request.

    Each state starts at a multiple of `state_alignment` bytes (vLLM 0.34), so each state's bytes
    are rounded up to it. In align mode (`model.mamba_cache_mode`) a request also keeps
    `num_prefill_checkpoint_blocks` extra state blocks for prefix-cache checkpoints."""

    kind: Literal["mamba"] = "mamba"
    state_shapes: Annotated[list[StateShape], Field(min_length=1), READ_ONLY] = Field(
        description="Each state's shape (e.g. conv, recurrent), one rank's share."
    )
    state_dtypes: Annotated[list[DType], Field(min_length=1), READ_ONLY] = Field(
        description="Each state's element type, one per shape."
    )
    page_size_padded: PositiveInt | None = Field(default=None, description=_PADDED_DOC)
    num_speculative_blocks: Annotated[int, Field(ge=0, le=2**31)] = Field(
        default=0, description="Extra state blocks a request keeps for speculative decoding."
    )
    state_alignment: PositiveInt = Field(
        default=1, description="Each state is rounded up to a multiple of this many bytes."
    )
    num_prefill_checkpoint_blocks: Annotated[int, Field(ge=0, le=2**31)] = Field(
        default=0, description="Align mode: extra state blocks a request keeps for checkpoints."
    )
    prefill_checkpoint_alignment: PositiveInt | None = Field(
        default=None, description="Tokens between two prefill checkpoints (null: none)."
    )

    @property
    def content_bytes(self) -> int:
        align = self.state_alignment
        return sum(
            -(-prod(shape) * dtype_size(dtype) // align) * align
            for shape, dtype in zip(self.state_shapes, self.state_dtypes, strict=True)
        )

    def _padded(self, natural: int) -> int | None:
        return self.page_size_padded

    def _derive(self) -> None:
        if len(self.state_dtypes) != len(self.state_shapes):
            raise ValueError(
                f"state_dtypes: expected one dtype per state shape ({len(self.state_shapes)}), "
                f"got {len(self.state_dtypes)}"
            )
        padded = self.page_size_padded
        if padded is not None and padded % self.state_alignment:
            raise ValueError(
                f"page_size_padded: expected a multiple of state_alignment "
                f"{self.state_alignment}, got {padded}"
            )
        super()._derive()


TaggedLayerSpec = (
    Annotated[MLASpec, Tag("mla")]
    | Annotated[FullAttentionSpec, Tag("full_attention")]
    | Annotated[SlidingWindowSpec, Tag("sliding_window")]
    | Annotated[ChunkedLocalAttentionSpec, Tag("chunked_local_attention")]
    | Annotated[CrossAttentionSpec, Tag("cross_attention")]
    | Annotated[SlidingWindowMLASpec, Tag("sliding_window_mla")]
    | Annotated[MambaSpec, Tag("mamba")]
)
"""Each layer kind tagged by its `kind`: the members of `LayerSpec`, and of the unions that add
kinds of their own (a group's `GroupSpec`)."""
LayerSpec = Annotated[TaggedLayerSpec, BY_KIND]
WindowedSpec = SlidingWindowSpec | SlidingWindowMLASpec

LAYER_SPEC_CLASSES: frozenset[type] = frozenset({
    MLASpec, FullAttentionSpec, SlidingWindowSpec, ChunkedLocalAttentionSpec,
    CrossAttentionSpec, SlidingWindowMLASpec, MambaSpec,
})
"""The classes a `LayerSpec` may be (exactly; no subclasses)."""
