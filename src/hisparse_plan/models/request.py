"""The plan request: what the model is, and what memory and scheduler it runs with (SPEC 4)."""

from __future__ import annotations

from typing import Annotated, Self

from pydantic import Field, ValidatorFunctionWrapHandler, field_validator
from pydantic.config import ExtraValues

from hisparse_plan.models.base import ByteCount, LayerName, Model, PositiveInt, freeze
from hisparse_plan.models.distinct import validate_distinct
from hisparse_plan.models.json_input import validate_request_json
from hisparse_plan.models.layer_specs import LayerSpec, MambaSpec
from hisparse_plan.models.layout import KVCacheLayout

RESIDENT_SUFFIX = ".hisparse_resident"
HOT_SUFFIX = ".hisparse_hot"
"""HiSparse names a source layer's resident and hot layers by these suffixes."""

MAX_HOST_POOL_GIB = 2.0**33
"""2**33 GiB is 2**63 bytes: the int64 limit of a byte offset."""


class ModelConfig(Model):
    max_model_len: PositiveInt
    index_topk: PositiveInt | None = Field(
        default=None, description="Top-k rows the indexer selects; HiSparse needs it."
    )
    auto_fit_max_model_len: bool = Field(
        default=False,
        description="max_model_len is the longest wanted; the plan may shorten it (SPEC 7.8).",
    )


class HisparseConfig(Model):
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


class PipelineStage(Model):
    """One pipeline stage: the layers it holds and the GPU bytes its KV cache may take."""

    layers: Annotated[list[LayerName], Field(min_length=1)]
    available_bytes: ByteCount


class DeviceConfig(Model):
    available_bytes: ByteCount
    kv_cache_layout: Annotated[KVCacheLayout, Field(strict=False)] = KVCacheLayout.BLNHC
    num_blocks_override: PositiveInt | None = None
    pipeline_stages: Annotated[list[PipelineStage], Field(min_length=1)] | None = Field(
        default=None,
        description="One entry per stage, in order; replaces available_bytes (SPEC 4.1).",
    )


class SchedulerConfig(Model):
    max_num_batched_tokens: PositiveInt = 8192
    max_concurrent_batches: PositiveInt = 1
    num_prefill_lookahead_tokens: Annotated[int, Field(ge=0, le=2**31)] = Field(
        default=0,
        description="Prefill tokens a speculative drafter reads past the scheduled range.",
    )

    @property
    def max_in_flight_tokens(self) -> int:
        return self.max_num_batched_tokens * self.max_concurrent_batches


class PlanRequest(Model):
    """Layers in model order (the order is significant), then the budgets."""

    layers: Annotated[dict[LayerName, LayerSpec], Field(min_length=1)]
    model: ModelConfig
    hisparse: HisparseConfig | None = None
    device: DeviceConfig
    scheduler: SchedulerConfig = SchedulerConfig()

    @field_validator("layers", mode="wrap")
    @classmethod
    def _each_distinct_spec_once(
        cls, value: object, handler: ValidatorFunctionWrapHandler
    ) -> object:
        # Equal layers (most of a model) share one validated spec: see models.distinct.
        return validate_distinct(value, handler)

    @classmethod
    def model_validate_json(
        cls,
        json_data: str | bytes | bytearray,
        *,
        strict: bool | None = None,
        extra: ExtraValues | None = None,
        context: object | None = None,
        by_alias: bool | None = None,
        by_name: bool | None = None,
    ) -> Self:
        """Validate a request's JSON text; a key named twice anywhere is a PlanError naming it
        (JSON parsers keep the last copy silently), and no error quotes much of the text."""
        return validate_request_json(
            bytes(json_data) if isinstance(json_data, bytearray) else json_data,
            lambda data: cls.model_validate(
                data, strict=strict, extra=extra, context=context, by_alias=by_alias,
                by_name=by_name,
            ),
        )

    def model_post_init(self, context: object, /) -> None:
        for name in self.layers:
            if name.endswith((RESIDENT_SUFFIX, HOT_SUFFIX)):
                raise ValueError(
                    f"layers[{name!r}]: names ending in {RESIDENT_SUFFIX!r} or {HOT_SUFFIX!r} "
                    "are reserved for the layers HiSparse derives; expected another name"
                )
        freeze(self, "layers", self.layers)


def spec_key(spec: LayerSpec) -> tuple[object, ...]:
    """A hashable key, equal for two specs exactly when every field is equal: what "the same
    spec" means (SPEC 4, 7.1); the planner groups layers by it."""
    values = tuple(spec.__dict__.values())
    if isinstance(spec, MambaSpec):  # the one kind with list fields
        return tuple(_frozen(value) for value in values)
    return values


def _frozen(value: object) -> object:
    return tuple(_frozen(item) for item in value) if isinstance(value, list) else value
