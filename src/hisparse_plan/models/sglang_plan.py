"""SGLang's plan: the pools its own classes would allocate for a request (see
docs/plan-contract.md#sglang-plans)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from hisparse_plan.models.base import (
    READ_ONLY,
    ByteCount,
    Model,
    PositiveInt,
    empty_frozen_list,
    is_zero,
)
from hisparse_plan.models.pools import BufferView, Pool
from hisparse_plan.models.tensors import Capacity, KVCacheTensor, refuse_layer_floods


class SGLangBudget(Model):
    """How the token budget came out (see docs/planning-rules.md#sglang-budget)."""

    available_bytes: ByteCount = Field(description="Bytes the KV pools may take.")
    cell_size_bytes: ByteCount | Annotated[float, Field(gt=0, allow_inf_nan=False)] = Field(
        description="Bytes of one token over the counted pools; a float where a window pool "
        "is counted at swa_full_tokens_ratio of a token; 0 on a pipeline rank of Mamba layers "
        "only (no KV layer to count)."
    )
    mem_fraction_static: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)] | None = Field(
        description="The fraction used (given or SGLang's rule), in (0, 1]; null when the "
        "budget was given."
    )
    swa_sized_for_requests: bool = Field(
        default=False,
        description="The window pool was sized for the running requests (the radix cache "
        "off, max_running_requests given), the full pool taking the rest of the budget; "
        "else it is swa_full_tokens_ratio of the full pool, and max_total_num_tokens cells "
        "fit the budget.",
    )
    dcp_size: PositiveInt = Field(
        default=1,
        description="Decode context parallelism's ranks (DSA models): each stored token is "
        "dcp_size token ids, and the index keys cover them all (charged dcp_size times a "
        "token).",
    )
    mamba_slots_per_request: Literal[1, 3, 4, 5] | None = Field(
        default=None,
        description="Mamba hybrids: the state slots one running request may hold, 5 with the "
        "radix cache on (SGLang's default; 4 without its overlap scheduler, as with pipeline "
        "stages; 3 with its no_buffer strategy, --disable-overlap-schedule on 1-token pages), "
        "1 with it off; null without Mamba layers (and in plans written before it was "
        "recorded, which mean 5).",
    )


class SGLangHisparseBuffer(Model):
    """One tensor HiSparse allocates beside the KV budget (its coordinator's per-request tables
    and top-k buffers, its host pool's slot tables, its allocator's id tables)."""

    owner: Literal[
        "coordinator", "host_pool", "allocator", "allocator.logical", "allocator.hisparse",
        "spec_swap",
    ] = Field(description="The SGLang object that allocates it (spec_swap: the coordinator's "
              "speculative swap, with speculative decoding).")
    name: str = Field(description="Its attribute name on that object.")
    location: Literal["device", "host"] = Field(
        description="device: GPU memory outside the KV budget; host: pageable CPU memory."
    )
    dtype: Literal["bool", "uint8", "int16", "int32", "int64", "uint64"] = Field(
        description="Element type."
    )
    shape: Annotated[list[Annotated[int, Field(ge=0)]], READ_ONLY] = Field(
        description="Its shape."
    )
    nbytes: ByteCount = Field(description="Bytes: the product of the shape times the element.")


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
    metadata: Annotated[list[SGLangHisparseBuffer], READ_ONLY] = Field(
        default_factory=empty_frozen_list,
        description="HiSparse's tensors beside the KV budget (HiSparseCoordinator, its host "
        "pool's slot tables, the HiSparse allocator's tables), on the GPU or the host.",
    )


V4EmptyPool = Literal["v4_c4", "v4_index_c4", "v4_c128"]
"""A DeepSeek-V4 pool a pipeline rank may keep without a buffer."""


class SGLangDeepSeekV4(Model):
    """DeepSeek-V4 on SGLang: the token counts of its compressed pools and how they came out
    (its configurator has no cell size; it splits the budget by a per-full-token coefficient)."""

    full_tokens: PositiveInt = Field(
        description="Full token ids the allocator hands out (max_total_num_tokens)."
    )
    swa_tokens: PositiveInt = Field(description="Tokens of the window pool (v4_swa).")
    swa_full_tokens_ratio: Annotated[float, Field(gt=0, allow_inf_nan=False)] = Field(
        description="Window tokens per full token used (0.1 unless given)."
    )
    c4_tokens: int = Field(ge=0, description="Compressed slots of v4_c4: full // 4.")
    c128_tokens: int = Field(ge=0, description="Compressed slots of v4_c128: full // 128.")
    c4_index_tokens: int = Field(
        ge=0, description="Index-key slots of v4_index_c4: c128 * 32."
    )
    c4_state_rows: int = Field(
        ge=0, description="Rows of each c4 compressor-state buffer (v4_state_c4 and "
        "v4_index_state_c4): 8 per window page, plus 9, rounded up to a multiple of 4."
    )
    c128_state_rows: int = Field(
        ge=0, description="Rows of each c128 compressor-state buffer: 128 per request slot, "
        "plus 129, rounded up to a multiple of 128."
    )
    bytes_per_full_token: Annotated[float, Field(gt=0, allow_inf_nan=False)] = Field(
        description="The coefficient the budget is divided by (window share included)."
    )
    fixed_bytes: ByteCount = Field(
        description="Bytes set aside before the split: the c128 states for the requested "
        "running requests."
    )
    empty_pools: Annotated[list[V4EmptyPool], READ_ONLY] = Field(
        default_factory=empty_frozen_list,
        description="Pools a pipeline rank keeps without a buffer: a compression ratio of the "
        "model its layers lack (SGLang keeps the pool, so that every rank's pools line up); "
        "their slot counts are the figures above. Empty without pipeline stages.",
    )


class SGLangSpeculative(Model):
    """Speculative decoding as SGLang resolved it: the draft worker's layers, its pools
    (`draft_*`, sharing the target's allocator and token count) and what it adds a token."""

    algorithm: Literal["EAGLE", "EAGLE3"] = Field(
        description="The algorithm SGLang runs (NEXTN runs as EAGLE)."
    )
    num_steps: PositiveInt = Field(description="speculative_num_steps, resolved.")
    eagle_topk: PositiveInt = Field(description="speculative_eagle_topk, resolved.")
    num_draft_tokens: PositiveInt = Field(description="speculative_num_draft_tokens, resolved.")
    draft_layers: Annotated[list[str], Field(min_length=1), READ_ONLY] = Field(
        description="The draft model's KV layers, named by the draft's own layer ids (0, 1, ...)."
    )
    draft_cell_size_bytes: ByteCount = Field(
        description="Bytes the draft's layers add to budget.cell_size_bytes (a full token's)."
    )
    draft_beyond_budget_bytes: ByteCount = Field(
        default=0, exclude_if=is_zero,
        description="Bytes the draft's full pools (`draft_kv`, `draft_kv_v`, `draft_index`) "
        "take, padding page aside, beyond what draft_cell_size_bytes charges the budget for "
        "them: SGLang prices every draft layer at the target's per-layer bytes "
        "(DefaultPoolConfigurator) while the draft worker builds its pools in the draft's own "
        "shape, so a draft with more heads (or a wider head) than the target's passes the "
        "budget by this much; 0 when its shape costs no more. The one engine rule by which "
        "an SGLang plan's pools pass its budget beyond their padding pages.",
    )
    draft_window_layers: Annotated[list[str], READ_ONLY] = Field(
        default_factory=list,
        description="Of draft_layers, a hybrid-window draft's window layers: its pool "
        "`draft_swa` holds them over the window pool's tokens, and each adds a window layer's "
        "bytes to the window part of the cell size (none: every draft layer is full).",
    )


class SGLangEmptyMambaPool(Model):
    """A Mamba state pool a pipeline rank keeps over none of its layers: a rank of a Mamba
    hybrid that keeps no Mamba layer still builds SGLang's MambaPool, for the slots every rank
    derives alike, over its empty slice of the model's Mamba layers: a zero-byte buffer."""

    name: Literal["mamba_conv0", "mamba_temporal"] = Field(
        description="The pool a rank with Mamba layers would have (its conv or temporal "
        "states).")
    slots: PositiveInt = Field(
        description="State slots beside the padding slot, as every rank of the model keeps.")
    view: BufferView = Field(
        description="SGLang's buffer: [0 layers, slots + 1, *one layer's state], contiguous, "
        "no element.")


class SGLangPipeline(Model):
    """Pipeline parallelism on SGLang: the plan is one rank's; the ranks agree on the tokens
    (see docs/planning-rules.md#sglang-pipeline)."""

    pp_size: Annotated[int, Field(ge=2)] = Field(description="Pipeline stages (ranks).")
    pp_rank: Annotated[int, Field(ge=0)] = Field(description="The rank this plan is for.")
    stage_layers: Annotated[list[PositiveInt], Field(min_length=2), READ_ONLY] = Field(
        description="Decoder layers of each rank, in rank order (SGLang's get_pp_indices: "
        "num_layers // pp_size each, the last num_layers % pp_size ranks one more)."
    )
    start_layer: Annotated[int, Field(ge=0)] = Field(
        description="This rank's first decoder layer (the layers of the ranks before it)."
    )
    stage_tokens: Annotated[list[PositiveInt], Field(min_length=2), READ_ONLY] = Field(
        description="Each rank's token capacity from its own budget and layers, before "
        "--max-total-tokens: max_total_num_tokens is at most the fewest (SGLang's MIN "
        "all-reduce over the ranks)."
    )
    mamba_stage_layers: PositiveInt | None = Field(
        default=None,
        description="Mamba hybrids: the most Mamba layers any rank keeps; every rank charges "
        "its state slots at that many layers, so all ranks get the same slots.",
    )
    empty_mamba_pools: Annotated[list[SGLangEmptyMambaPool], READ_ONLY] = Field(
        default_factory=empty_frozen_list,
        description="A rank of a Mamba hybrid keeping none of its Mamba layers: the Mamba "
        "pools SGLang builds over no layer (conv, then temporal states), in place of pools "
        "and tensors (a tensor has layers); empty on every other rank.",
    )


class SGLangPlan(Model):
    """SGLang 0.5.23's KV pools for one request: what its own classes would allocate."""

    schema_version: Literal[2] = Field(default=2, description="2.")
    engine: Literal["sglang"] = Field(default="sglang", description="sglang.")

    @model_validator(mode="before")
    @classmethod
    def _bounded(cls, data: object) -> object:
        return refuse_layer_floods(data)

    pools: Annotated[list[Pool], Field(min_length=1), READ_ONLY] = Field(
        description="SGLang's pools (kv, swa, index, mamba_*, hisparse_host, v4_*)."
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
    deepseek_v4: SGLangDeepSeekV4 | None = Field(
        default=None, description="DeepSeek-V4's pool token counts; null for other models."
    )
    speculative: SGLangSpeculative | None = Field(
        default=None,
        description="Speculative decoding's draft worker; null without speculative decoding.",
    )
    pipeline: SGLangPipeline | None = Field(
        default=None,
        description="Pipeline parallelism: which rank's layers and how the ranks' tokens "
        "agree; null with one stage.",
    )
    capacity: Capacity = Field(description="How many context_length requests the pools hold.")
    warnings: Annotated[list[str], READ_ONLY] = Field(
        default_factory=empty_frozen_list,
        description="Conditions that plan but waste memory.",
    )
    index_placeholder_layers: Annotated[list[str], READ_ONLY] = Field(
        default_factory=empty_frozen_list,
        description="DSA layers that share an earlier layer's index (index_topk_freq): SGLang "
        "gives each a zero-row index_k buffer [0, page_size * 132] and no bytes; the index "
        "pool's tensor holds the indexer layers only.",
    )

    def allocation_layers(self, pool: Pool) -> list[str | None]:
        """Who owns each allocation of `pool`: every layer of its tensors, in plan order, for a
        per-layer pool; `[None]` (one allocation for all) for a whole pool."""
        if pool.allocation == "whole":
            return [None]
        layers: dict[str | None, None] = {}
        for tensor in self.tensors:
            if tensor.pool == pool.name:
                layers.update(dict.fromkeys(tensor.layers))
        return list(layers)
