"""The plan request: what the model is, and what memory and scheduler it runs with (see
docs/planning-rules.md#requests)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal, Self

from pydantic import Field, ValidatorFunctionWrapHandler, field_validator

from hisparse_plan.models.base import (
    MAX_LAYER_NAMES,
    READ_ONLY,
    ByteCount,
    LayerName,
    Model,
    PositiveInt,
    freeze,
)
from hisparse_plan.models.distinct import validate_distinct
from hisparse_plan.models.engines import SGLangSettings
from hisparse_plan.models.json_input import validate_request_json
from hisparse_plan.models.json_model import JsonTextModel
from hisparse_plan.models.kv_sharing import check_sharing_targets
from hisparse_plan.models.layer_specs import LayerSpec, MambaSpec
from hisparse_plan.models.layout import KVCacheLayout

RESIDENT_SUFFIX = ".hisparse_resident"
HOT_SUFFIX = ".hisparse_hot"
"""HiSparse names a source layer's resident and hot layers by these suffixes."""

MAX_HOST_POOL_GIB = 2.0**33
"""2**33 GiB is 2**63 bytes: the int64 limit of a byte offset."""


class ModelConfig(Model):
    """What the model serves: the longest request, and (HiSparse) the indexer's top-k."""

    max_model_len: PositiveInt = Field(
        description="The longest request in tokens: one must fit beside the null block."
    )
    index_topk: PositiveInt | None = Field(
        default=None, description="Top-k rows the indexer selects; HiSparse needs it."
    )
    auto_fit_max_model_len: bool = Field(
        default=False,
        description="max_model_len is the longest wanted; the plan may shorten it (see "
        "docs/planning-rules.md#auto-fit).",
    )
    mamba_cache_mode: Literal["none", "align"] = Field(
        default="none",
        description=(
            "How Mamba states are cached: 'align' (vLLM's mode with prefix caching on) keeps "
            "2 + speculative + checkpoint state blocks per request."
        ),
    )


class HisparseConfig(Model):
    """HiSparse's settings: the host pool budget and the per-request hot buffer."""

    host_pool_gib: float = Field(
        gt=0, lt=MAX_HOST_POOL_GIB, allow_inf_nan=False,
        description="Host budget; int(host_pool_gib * 2**30) bytes.",
    )
    device_buffer_size: PositiveInt | None = Field(
        default=None, description="Hot rows per request; null = (max_decode_query_len + 1) * top-k."
    )
    max_decode_query_len: PositiveInt = Field(default=1, description="1 + speculative tokens.")
    shared_host_pool: bool = Field(
        default=False, description="TP ranks on one host share one pool (page-aligned blocks)."
    )
    host_pool_layout: Literal["layer_outermost", "block_outermost"] = Field(
        default="layer_outermost",
        description="The host pool's placement: layer_outermost as vLLM 0.33/0.34 lay it out "
        "(LBNHC), or block_outermost (BLNHC: a block's source pages back to back, lined up "
        "with a block-outermost prefill's block; no engine runtime takes it yet, see "
        "docs/transfer.md#placement-that-transfers-well).",
    )


class PipelineStage(Model):
    """One pipeline stage: the layers it holds and the GPU bytes its KV cache may take."""

    layers: Annotated[list[LayerName], Field(min_length=1), READ_ONLY] = Field(
        description="The stage's layers (request names)."
    )
    available_bytes: ByteCount = Field(description="GPU bytes the stage's KV cache may take.")


class DeviceConfig(Model):
    """The GPU memory for the KV cache and how the device pool lays it out."""

    available_bytes: ByteCount = Field(
        description="GPU bytes the KV cache may take (0 with pipeline_stages)."
    )
    kv_cache_layout: Annotated[KVCacheLayout, Field(strict=False)] = Field(
        default=KVCacheLayout.BLNHC,
        description="Physical order of the axes L, B, H, N, C of the device pool.",
    )
    num_blocks_override: PositiveInt | None = Field(
        default=None, description="Use this many device blocks whatever the memory holds."
    )
    pipeline_stages: Annotated[list[PipelineStage], Field(min_length=1), READ_ONLY] | None = Field(
        default=None,
        description="One entry per stage, in order; replaces available_bytes (see "
        "docs/planning-rules.md#requests).",
    )
    compute_capability: Annotated[
        tuple[PositiveInt, Annotated[int, Field(ge=0, le=9)]], Field(strict=False)
    ] | None = Field(
        default=None,
        description="The CUDA compute capability [major, minor] of the GPU vLLM runs on: the "
        "plan is held to the stride rules of the kernels of the backends vLLM 0.34 selects "
        "there; null: to the rules every GPU's backends share (see "
        "docs/planning-rules.md#backends-and-layout). SGLang's is engine.compute_capability.",
    )


class SchedulerConfig(Model):
    """The scheduler's budget, which sizes resident and windowed caches."""

    max_num_batched_tokens: PositiveInt = Field(
        default=8192, description="Tokens the scheduler runs per step."
    )
    max_concurrent_batches: PositiveInt = Field(
        default=1, description="Batches in flight (e.g. pipeline parallelism)."
    )
    num_prefill_lookahead_tokens: Annotated[int, Field(ge=0, le=2**31)] = Field(
        default=0,
        description="Prefill tokens a speculative drafter reads past the scheduled range.",
    )
    disable_hybrid_kv_cache_manager: bool = Field(
        default=False,
        description=(
            "vLLM's hybrid KV cache manager is off: sliding-window and chunked-local layers are "
            "promoted to full allocation before grouping."
        ),
    )
    decode_context_parallel_size: Annotated[int, Field(ge=1, le=2**31)] = Field(
        default=1,
        description="Decode context parallelism: a rank holds 1/dcp of a sharded layer's tokens.",
    )

    @property
    def max_in_flight_tokens(self) -> int:
        return self.max_num_batched_tokens * self.max_concurrent_batches


class PlanRequest(JsonTextModel):
    """Layers in model order (the order is significant), then the budgets (see
    docs/planning-rules.md#requests)."""

    layers: Annotated[dict[LayerName, LayerSpec],
                      Field(min_length=1, max_length=MAX_LAYER_NAMES)] = Field(
        description="Layer name -> how it stores its cache, in model order."
    )
    model: ModelConfig
    hisparse: HisparseConfig | None = Field(
        default=None, description="HiSparse's settings; null plans a regular model."
    )
    device: DeviceConfig
    scheduler: SchedulerConfig = SchedulerConfig()
    engine: SGLangSettings | None = Field(
        default=None,
        description="The engine whose pools to plan: null for vLLM; SGLang's server settings "
        "for SGLang (see docs/planning-rules.md#sglang).",
    )

    @field_validator("layers", mode="wrap")
    @classmethod
    def _each_distinct_spec_once(
        cls, value: object, handler: ValidatorFunctionWrapHandler
    ) -> object:
        # Equal layers (most of a model) share one validated spec: see models.distinct.
        return validate_distinct(value, handler)

    @classmethod
    def _validate_json_text(cls, text: str | bytes,
                            validate: Callable[[dict[str, Any]], Self]) -> Self:
        """A key named twice anywhere is a PlanError naming it (JSON parsers keep the last copy
        silently), and no error quotes much of the text."""
        return validate_request_json(text, validate)

    def model_post_init(self, context: object, /) -> None:
        # One search of all names at once finds any reserved ending; only then are they
        # looked at one by one (a name may itself contain the separator).
        joined = "\n".join(self.layers) + "\n"
        if RESIDENT_SUFFIX + "\n" in joined or HOT_SUFFIX + "\n" in joined:
            self._refuse_reserved_names()
        check_sharing_targets(self.layers)
        freeze(self, "layers", self.layers)

    def _refuse_reserved_names(self) -> None:
        for name in self.layers:
            if name.endswith((RESIDENT_SUFFIX, HOT_SUFFIX)):
                raise ValueError(
                    f"layers[{name!r}]: names ending in {RESIDENT_SUFFIX!r} or {HOT_SUFFIX!r} "
                    "are reserved for the layers HiSparse derives; expected another name"
                )


def spec_key(spec: LayerSpec) -> tuple[object, ...]:
    """A hashable key, equal for two specs exactly when every field is equal: what "the same
    spec" means (see docs/planning-rules.md#requests, #pages); the planner groups layers by it."""
    values = tuple(spec.__dict__.values())
    if isinstance(spec, MambaSpec):  # the one kind with list fields
        return tuple(_frozen(value) for value in values)
    return values


def _frozen(value: object) -> object:
    return tuple(_frozen(item) for item in value) if isinstance(value, list) else value
