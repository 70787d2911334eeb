"""SGLang's plan: the pools its own classes would allocate for a request (see
docs/plan-contract.md#sglang-plans)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from hisparse_plan.models.base import READ_ONLY, ByteCount, Model, PositiveInt
from hisparse_plan.models.plan import Capacity, KVCacheTensor
from hisparse_plan.models.pools import BufferView, Pool


class SGLangBudget(Model):
    """How the token budget came out (see docs/planning-rules.md#sglang-budget)."""

    available_bytes: ByteCount = Field(description="Bytes the KV pools may take.")
    cell_size_bytes: PositiveInt | Annotated[float, Field(gt=0, allow_inf_nan=False)] = Field(
        description="Bytes of one token over the counted pools; a float where a window pool "
        "is counted at swa_full_tokens_ratio of a token."
    )
    mem_fraction_static: float | None = Field(
        description="The fraction used (given or SGLang's rule); null when the budget was given."
    )


class SGLangHisparse(Model):
    """HiSparse on SGLang: the host pool holds every token, the GPU a hot buffer per request."""

    top_k: PositiveInt = Field(description="Rows the indexer selects per query.")
    device_buffer_size: PositiveInt = Field(description="Hot rows per request.")
    hot_rows_per_request: PositiveInt = Field(
        description="Device rows one request's hot buffer takes: device_buffer_size + page_size."
    )
    host_to_device_ratio: PositiveInt = Field(description="Host tokens per device token.")
    host_tokens: PositiveInt = Field(description="Tokens of the pinned host pool (with padding).")
    logical_tokens: PositiveInt = Field(description="Token ids the allocator hands out.")


class SGLangPlan(Model):
    """SGLang 0.5.23's KV pools for one request: what its own classes would allocate."""

    schema_version: Literal[2] = Field(default=2, description="2.")
    engine: Literal["sglang"] = Field(default="sglang", description="sglang.")
    pools: Annotated[list[Pool], Field(min_length=1), READ_ONLY] = Field(
        description="SGLang's pools (kv, swa, index, mamba_*, hisparse_host)."
    )
    tensors: Annotated[list[KVCacheTensor], Field(min_length=1), READ_ONLY] = Field(
        description="Every layer's pages, with SGLang's own buffers as views."
    )
    page_size: PositiveInt = Field(description="Tokens per page.")
    max_total_num_tokens: PositiveInt = Field(description="Tokens of the full pool.")
    max_running_requests: PositiveInt = Field(description="Requests running at once.")
    req_to_token: BufferView = Field(description="int32 [max_running_requests + 1, width].")
    budget: SGLangBudget = Field(description="How the token budget came out.")
    hisparse: SGLangHisparse | None = Field(
        default=None, description="HiSparse's host pool and hot buffers; null without it."
    )
    capacity: Capacity = Field(description="How many context_length requests the pools hold.")
    warnings: Annotated[list[str], READ_ONLY] = Field(
        default_factory=list, validate_default=True,
        description="Conditions that plan but waste memory.",
    )
