"""The parts of a plan both engines' plans are made of: the tensors that place layers' pages in a
pool, and the capacity the pools give (see docs/plan-contract.md)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from hisparse_plan.models.base import (
    MAX_LAYER_NAMES,
    MAX_PLAN_LAYER_NAMES,
    READ_ONLY,
    ByteCount,
    LayerName,
    Model,
    empty_frozen_list,
)
from hisparse_plan.models.pools import BufferView, PageRange, PoolName

LayerNames = Annotated[
    list[LayerName], Field(min_length=1, max_length=MAX_LAYER_NAMES), READ_ONLY]
Concurrency = Annotated[float, Field(ge=0, allow_inf_nan=False)]


def refuse_layer_floods(data: object) -> object:
    """A plan's tensors name at most MAX_PLAN_LAYER_NAMES layers in all (a plan's `before`
    validator): counted on the JSON's lists, before any is validated, so a plan of a million
    layers spread over many tensors costs its reading, not a proof of each layer."""
    tensors = data.get("tensors") if isinstance(data, dict) else None
    if not isinstance(tensors, list):
        return data
    named = sum(len(tensor["layers"]) for tensor in tensors
                if isinstance(tensor, dict) and isinstance(tensor.get("layers"), list))
    if named > MAX_PLAN_LAYER_NAMES:
        raise ValueError(f"the tensors name {named} layers; expected at most "
                         f"{MAX_PLAN_LAYER_NAMES} (a 100,000-layer model's plan names about "
                         "300,000)")
    return data


class KVCacheTensor(Model):
    """Same-spec layers in one pool: layer `layers[l]`'s page of block `b` starts at
    `offset + l * layer_stride + b * block_stride` bytes into the pool."""

    size: ByteCount = Field(description="Bytes of the pool the tensor is a view of.")
    layers: LayerNames = Field(description="Same-spec layers, in order: layers[l] is index l.")
    layer_stride: ByteCount = Field(
        description="Bytes from one layer's page to the next layer's, same block."
    )
    block_stride: ByteCount = Field(
        description="Bytes from one block's page to the next block's, same layer."
    )
    offset: ByteCount = Field(description="Where layer 0's page of block 0 starts in the pool.")
    host_resident: bool = Field(description="True for a tensor of the host pool.")
    pool: PoolName = Field(description="The pool (in the plan's `pools`) the tensor lives in.")
    ranges: Annotated[list[PageRange], Field(min_length=1), READ_ONLY] | None = Field(
        default=None,
        description="The parts of one layer's page, from the page's start (SGLang's K and V "
        "halves); null: one range, the group spec's page.",
    )
    views: Annotated[list[BufferView], READ_ONLY] = Field(
        default_factory=empty_frozen_list,
        description="The engine's own tensors over the pool (SGLang); empty for vLLM, whose "
        "views follow from the group specs.",
    )


class Capacity(Model):
    """How many max_model_len requests the pools hold (see docs/planning-rules.md#capacity)."""

    max_concurrency: Concurrency = Field(
        description="Concurrent max_model_len requests the pools hold, each with its whole "
        "window."
    )
    steady_state_concurrency: Concurrency | None = Field(
        description="HiSparse: the same once requests read from host and keep only their last "
        "resident pages; null for regular plans."
    )
