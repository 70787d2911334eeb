"""Pools, page ranges and engine buffer views: the parts of plan contract 2 that describe memory
for any engine (see docs/plan-contract.md#pools)."""

from __future__ import annotations

from math import prod
from typing import Annotated, Final, Literal

from pydantic import Field, StringConstraints

from hisparse_plan.models.base import READ_ONLY, ByteCount, Model, PositiveInt

PoolName = Annotated[str, StringConstraints(min_length=1, max_length=200)]
Elements = Annotated[int, Field(ge=0, le=2**63 - 1)]

BUFFER_DTYPE_SIZE: Final[dict[str, int]] = {
    "uint8": 1, "int8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
    "bfloat16": 2, "float16": 2, "int16": 2,
    "float32": 4, "int32": 4,
    "float64": 8, "int64": 8,
}
"""Bytes per element of every dtype an engine buffer may have (KV rows, states, indices)."""

BufferDType = Literal[
    "uint8", "int8", "float8_e4m3fn", "float8_e5m2", "bfloat16", "float16", "int16", "float32",
    "int32", "float64", "int64",
]


class Pool(Model):
    """One memory pool: a single allocation, or one allocation per layer of its tensors."""

    name: PoolName = Field(description="Unique in the plan; tensors name their pool by it.")
    location: Literal["device", "host"] = Field(description="GPU memory, or pinned host memory.")
    stage: Annotated[int, Field(ge=0, le=2**31)] = Field(
        default=0, description="The pipeline stage a device pool belongs to."
    )
    allocation: Literal["whole", "per_layer"] = Field(
        description="whole: one buffer of `size` bytes holds every layer of its tensors; "
        "per_layer: each layer of its tensors has a buffer of its own of `size` bytes (its "
        "tensors have layer_stride 0)."
    )
    size: ByteCount = Field(description="Bytes of one allocation.")
    num_blocks: PositiveInt = Field(
        description="Blocks (pages, or state slots) its tensors index, padding blocks included."
    )
    block_tokens: PositiveInt | None = Field(
        description="Tokens one block holds (SGLang's page_size; 1 for state slots); null where "
        "groups of different block sizes share the pool (vLLM: each group's spec.block_size)."
    )
    padding_blocks: Annotated[int, Field(ge=0, le=2**31)] = Field(
        description="Leading blocks never given to a request: vLLM's null block 0, SGLang's "
        "padding page 0 or Mamba slot 0."
    )
    shared: bool = Field(
        default=False, description="A host pool that tensor-parallel ranks on one host map."
    )


class PageRange(Model):
    """Part of one layer's page of one block, from the page's start."""

    offset: ByteCount = Field(description="Bytes from the start of the page.")
    size: PositiveInt = Field(description="Bytes of the range.")


class BufferView(Model):
    """An engine's own tensor over one allocation (over each layer's allocation when the pool
    is per_layer), in elements of `dtype`."""

    name: Annotated[str, StringConstraints(min_length=1, max_length=200)] = Field(
        description="What the engine calls it (k_buffer, v_buffer, kv_buffer, index_k, ...)."
    )
    dtype: BufferDType = Field(description="torch dtype name, without 'torch.'.")
    shape: Annotated[list[Elements], Field(min_length=1, max_length=8), READ_ONLY] = Field(
        description="Elements per axis."
    )
    strides: Annotated[list[Elements], Field(min_length=1, max_length=8), READ_ONLY] = Field(
        description="Elements between neighbours along each axis."
    )
    storage_offset: Elements = Field(
        description="Elements from the allocation's start to element [0, ..., 0]."
    )

    @property
    def end_byte(self) -> int:
        """Bytes from the allocation's start to the end of the last element (0 for an empty
        view). Shape and strides must be of one length, which check_plan proves first."""
        if prod(self.shape) == 0:
            return 0
        last = self.storage_offset + sum(
            (extent - 1) * stride for extent, stride in zip(self.shape, self.strides, strict=True))
        return (last + 1) * BUFFER_DTYPE_SIZE[self.dtype]


def stage_pool_name(location: Literal["device", "host"], stage: int, stages: int) -> str:
    """The name a `KVCachePlan` (vLLM's) gives a pool: `host`, `device`, or `device.K` per
    pipeline stage."""
    if location == "host":
        return "host"
    return "device" if stages == 1 else f"device.{stage}"


vllm_pool_name = stage_pool_name
"""The name stage_pool_name had before models/ kept engine names to models/engines.py."""
