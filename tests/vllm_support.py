"""Running vLLM 0.33's own planner on CPU for a plan request, and reading its answer in the
plan contract's terms. Needs vLLM (import this only after `pytest.importorskip("vllm")`).

A real `VllmConfig` needs a model and a device; `StandInConfig` carries only what vLLM's
planning reads (see /work/notes/vllm_facts.md), with the same names.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from vllm.config.attention import HiSparseConfig  # type: ignore[import-not-found, unused-ignore]
from vllm.v1.core import kv_cache_planning as planning  # type: ignore[import-not-found, unused-ignore]
from vllm.v1.core.kv_cache_utils import get_max_concurrency_for_kv_cache_config  # type: ignore[import-not-found, unused-ignore]
from vllm.v1.hisparse import layout as hisparse_layout  # type: ignore[import-not-found, unused-ignore]
from vllm.v1.kv_cache_layout import KVCacheLayout as VllmLayout  # type: ignore[import-not-found, unused-ignore]

from hisparse_plan.adapters.vllm import BUILDER_QUALNAME
from hisparse_plan.adapters.vllm.specs import fresh_layer_spec
from hisparse_plan.models import PlanRequest

DEFAULT_BUILDER = "vllm.v1.core.kv_cache_planning.DefaultKVCacheConfigBuilder"

KIND_OF = {
    "UniformTypeKVCacheSpecs": "uniform_type",
    "MLAAttentionSpec": "mla",
    "SlidingWindowMLASpec": "sliding_window_mla",
    "FullAttentionSpec": "full_attention",
    "SlidingWindowSpec": "sliding_window",
    "ChunkedLocalAttentionSpec": "chunked_local_attention",
    "MambaSpec": "mamba",
    "HiSparseResidentSpec": "hisparse_resident",
    "HiSparseHotSpec": "hisparse_hot",
}


class _Cache(SimpleNamespace):
    def get_resolved_kv_cache_layout(self) -> VllmLayout:
        return VllmLayout[self.kv_cache_layout]


@dataclass
class _Speculative:
    num_speculative_tokens: int
    parallel_drafting: bool = False

    def use_eagle_block_drop(self) -> bool:
        return False


@dataclass
class StandInConfig:
    """The attributes of `VllmConfig` that KV cache planning reads."""

    model_config: SimpleNamespace
    cache_config: _Cache
    scheduler_config: SimpleNamespace
    parallel_config: SimpleNamespace
    attention_config: SimpleNamespace
    kv_transfer_config: Any
    speculative_config: _Speculative | None
    max_concurrent_batches: int
    num_prefill_lookahead_tokens: int
    use_v2_model_runner: bool = True
    device_config: SimpleNamespace = field(
        default_factory=lambda: SimpleNamespace(device_type="cuda")
    )

    @property
    def max_in_flight_tokens(self) -> int:
        batched: int = self.scheduler_config.max_num_batched_tokens
        return self.max_concurrent_batches * batched


@dataclass
class VllmInputs:
    """What vLLM's engine hands its planner for one request: every layer's spec, and per
    pipeline stage (one worker each) its layers and KV cache memory."""

    specs: dict[str, Any]
    config: StandInConfig
    available_bytes: int
    shared_host_pool: bool
    stages: list[tuple[list[str], int]] | None = None

    def worker_specs(self) -> list[dict[str, Any]]:
        if self.stages is None:
            return [dict(self.specs)]
        return [{name: self.specs[name] for name in names} for names, _ in self.stages]

    def worker_memory(self) -> list[int]:
        if self.stages is None:
            return [self.available_bytes]
        return [memory for _, memory in self.stages]


@dataclass
class VllmRun:
    """vLLM's answer: the global groups, one config per worker, and the engine config after
    planning (auto-fit may have shortened max_model_len)."""

    groups: list[Any]
    configs: list[Any]
    config: StandInConfig


def vllm_inputs(request: dict[str, Any]) -> VllmInputs:
    """vLLM spec objects and engine config equivalent to a plan request (SPEC 4, 4.1)."""
    validated = PlanRequest.model_validate(request)
    specs = {name: fresh_layer_spec(spec, 0) for name, spec in validated.layers.items()}
    model = validated.model
    device = validated.device
    scheduler = validated.scheduler
    hisparse = validated.hisparse
    connector = None
    speculative = None
    attention = SimpleNamespace(hisparse_config=None)
    if hisparse is not None:
        attention.hisparse_config = HiSparseConfig(device_buffer_size=hisparse.device_buffer_size)
        connector = SimpleNamespace(
            kv_connector="HiSparseConnector",
            kv_connector_extra_config={"host_pool_gib": hisparse.host_pool_gib},
        )
        if hisparse.max_decode_query_len > 1:
            speculative = _Speculative(hisparse.max_decode_query_len - 1)
    config = StandInConfig(
        model_config=SimpleNamespace(
            max_model_len=model.max_model_len,
            original_max_model_len=-1 if model.auto_fit_max_model_len else model.max_model_len,
            supports_kv_cache_grouping=False,
            hf_config=SimpleNamespace(index_topk=model.index_topk),
        ),
        cache_config=_Cache(
            kv_cache_layout=device.kv_cache_layout.value,
            num_gpu_blocks_override=device.num_blocks_override,
            prefix_cache_retention_interval=None,
            mamba_cache_mode="none",
        ),
        scheduler_config=SimpleNamespace(
            max_num_batched_tokens=scheduler.max_num_batched_tokens,
            disable_hybrid_kv_cache_manager=False,
        ),
        parallel_config=SimpleNamespace(
            decode_context_parallel_size=1, tensor_parallel_size=1,
        ),
        attention_config=attention,
        kv_transfer_config=connector,
        speculative_config=speculative,
        max_concurrent_batches=scheduler.max_concurrent_batches,
        num_prefill_lookahead_tokens=scheduler.num_prefill_lookahead_tokens,
    )
    shared = hisparse is not None and hisparse.shared_host_pool
    stages = None if device.pipeline_stages is None else [
        (list(stage.layers), stage.available_bytes) for stage in device.pipeline_stages
    ]
    return VllmInputs(
        _with_derived(specs, config), config, device.available_bytes, shared, stages
    )


def _with_derived(specs: dict[str, Any], config: StandInConfig) -> dict[str, Any]:
    """A HiSparse worker also registers the resident and hot layers HiSparse derives (vLLM's
    `resolve_hisparse_specs`); a request vLLM cannot group keeps its own layers only."""
    try:
        groups = hisparse_layout.get_hisparse_kv_cache_groups(config, specs)
    except (ValueError, AssertionError):
        return specs
    derived = {
        name: group.kv_cache_spec
        for group in groups or []
        if type(group.kv_cache_spec).__name__ in ("HiSparseResidentSpec", "HiSparseHotSpec")
        for name in group.layer_names
    }
    return specs | derived


@contextlib.contextmanager
def vllm_world(builder: str, shared_host_pool: bool) -> Iterator[None]:
    """vLLM with `builder` as the platform's choice, and the shared-pool answer a CUDA TP>1
    deployment would give (CPU always says no)."""
    from vllm.platforms import (  # type: ignore[import-not-found, unused-ignore]
        current_platform,
    )

    platform_cls = type(current_platform)
    saved_builder = platform_cls.__dict__.get("get_kv_cache_config_builder_cls")
    saved_shared = hisparse_layout.use_shared_hisparse_host_pool

    def choose(cls: type, vllm_config: Any) -> str:
        del cls, vllm_config
        return builder

    platform_cls.get_kv_cache_config_builder_cls = classmethod(choose)
    hisparse_layout.use_shared_hisparse_host_pool = lambda vllm_config: shared_host_pool
    try:
        yield
    finally:
        hisparse_layout.use_shared_hisparse_host_pool = saved_shared
        if saved_builder is None:
            del platform_cls.get_kv_cache_config_builder_cls
        else:
            platform_cls.get_kv_cache_config_builder_cls = saved_builder


def run_vllm(inputs: VllmInputs, builder: str = DEFAULT_BUILDER) -> VllmRun:
    """vLLM's engine flow: global grouping, then `get_kv_cache_configs` (a worker per stage)."""
    config = copy.deepcopy(inputs.config)
    workers = inputs.worker_specs()
    with vllm_world(builder, inputs.shared_host_pool):
        groups = planning.get_global_kv_cache_groups(config, workers)
        configs = planning.get_kv_cache_configs(
            config, workers, inputs.worker_memory(), groups
        )
    return VllmRun(groups, configs, config)


def engine_configs(inputs: VllmInputs, builder: str = DEFAULT_BUILDER) -> list[Any]:
    """The configs of `run_vllm`."""
    configs: list[Any] = run_vllm(inputs, builder).configs
    return configs


def plugged_configs(inputs: VllmInputs) -> list[Any]:
    """The same flow with hisparse_plan's builder plugged in."""
    return engine_configs(inputs, BUILDER_QUALNAME)


def canonical(config: Any) -> Any:
    """A KVCacheConfig as nested plain data that keeps every field, spec types and dict order
    (dataclass equality ignores the order of a UniformTypeKVCacheSpecs' members)."""
    return _plain(config)


def _plain(value: Any) -> Any:
    if hasattr(value, "__dataclass_fields__"):
        return (type(value).__name__, tuple(
            (name, _plain(getattr(value, name))) for name in value.__dataclass_fields__
        ))
    if isinstance(value, dict):
        return tuple((key, _plain(item)) for key, item in value.items())
    if isinstance(value, list | tuple):
        return tuple(_plain(item) for item in value)
    return value


def contract_view(config: Any, inputs: VllmInputs) -> dict[str, Any]:
    """One worker's KVCacheConfig in the plan contract's shape (section 6)."""
    return run_view(VllmRun(config.kv_cache_groups, [config], inputs.config))


def run_view(run: VllmRun) -> dict[str, Any]:
    """vLLM's answer in the plan contract's shape (section 6), for `golden.project`: the global
    groups, every worker's tensors in stage order, capacity as the engine computes it."""
    first = run.configs[0]
    groups = []
    for group in run.groups:
        spec = group.kv_cache_spec
        groups.append({
            "layer_names": list(group.layer_names),
            "spec": {
                "kind": KIND_OF.get(type(spec).__name__, type(spec).__name__),
                "block_size": spec.block_size,
                "page_size_bytes": spec.page_size_bytes,
                "blocks_per_request": getattr(spec, "blocks_per_request", None),
            },
            "role": group.role.value,
            "host_resident": group.host_resident,
            "enable_kv_transfer": group.enable_kv_transfer,
        })
    host = None
    steady = None
    if first.hisparse_host_num_blocks is not None:
        host = {"num_blocks": first.hisparse_host_num_blocks,
                "block_stride": first.hisparse_host_block_stride,
                "shared": first.hisparse_shared_host_pool}
        steady = hisparse_layout.get_hisparse_steady_state_concurrency(run.config, first)
    view: dict[str, Any] = {
        "num_blocks": first.num_blocks,
        "groups": groups,
        "tensors": [
            {"size": t.size, "layers": list(t.layers), "layer_stride": t.layer_stride,
             "block_stride": t.block_stride, "offset": t.offset, "host_resident": t.host_resident}
            for config in run.configs
            for t in config.kv_cache_tensors
        ],
        "host_pool": host,
        "capacity": {
            "max_concurrency": get_max_concurrency_for_kv_cache_config(run.config, first),
            "steady_state_concurrency": steady,
        },
    }
    if run.config.model_config.original_max_model_len == -1:
        view["fitted_max_model_len"] = run.config.model_config.max_model_len
    return view
