"""How one attention layer stores its cache (SPEC section 4 and 5.1)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from hisparse_plan.models.base import ByteCount, Model, PositiveInt
from hisparse_plan.models.derived import store_derived
from hisparse_plan.models.dtypes import DType, dtype_size

_PAGE_DOC = (
    "Derived: num_kv_heads * block_size * content bytes. Optional on input; checked if given."
)


class AttentionLayerSpec(Model):
    """Fields every attention layer has; `content_bytes` is one token row of one head."""

    kind: str
    block_size: PositiveInt
    head_size: PositiveInt
    dtype: DType = "bfloat16"
    num_kv_heads: PositiveInt = 1
    page_size_bytes: ByteCount = Field(default=0, description=_PAGE_DOC)

    @property
    def content_bytes(self) -> int:
        raise NotImplementedError

    @property
    def dtype_size(self) -> int:
        return dtype_size(self.dtype)

    def model_post_init(self, context: object, /) -> None:
        self._derive()

    def _derive(self) -> None:
        page = self.num_kv_heads * self.block_size * self.content_bytes
        store_derived(self, "page_size_bytes", page, "num_kv_heads * block_size * content bytes")


class MLASpec(AttentionLayerSpec):
    """A multi-head latent attention layer: a sparse (source) layer or an indexer's keys."""

    kind: Literal["mla"] = "mla"
    cache_dtype: str | None = None
    state_content_bytes: PositiveInt | None = Field(
        default=None, description="Bytes of one packed token row (e.g. 656 for fp8_ds_mla)."
    )
    cache_role: Literal["sparse", "indexer"] = "sparse"
    is_index_group_leader: bool = False
    model_version: str | None = None
    topk_buffer_width: PositiveInt | None = None

    @property
    def content_bytes(self) -> int:
        if self.state_content_bytes is not None:
            return self.state_content_bytes
        return self.head_size * self.dtype_size

    def _derive(self) -> None:
        if self.state_content_bytes is not None and self.state_content_bytes % self.dtype_size:
            raise ValueError(
                f"state_content_bytes: expected a multiple of the {self.dtype} size "
                f"{self.dtype_size}, got {self.state_content_bytes}"
            )
        super()._derive()


class KVLayerSpec(AttentionLayerSpec):
    """A layer with separate K and V rows of `head_size` and `head_size_v` elements."""

    num_kv_heads: PositiveInt
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
    kind: Literal["full_attention"] = "full_attention"


class SlidingWindowSpec(KVLayerSpec):
    kind: Literal["sliding_window"] = "sliding_window"
    sliding_window: PositiveInt


LayerSpec = Annotated[
    MLASpec | FullAttentionSpec | SlidingWindowSpec, Field(discriminator="kind")
]
