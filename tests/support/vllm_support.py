"""Running vLLM's own planner (0.33 or 0.34) on CPU for a plan request, and reading its answer
in the plan contract's terms. Needs vLLM (import this only after `pytest.importorskip("vllm")`).

Every case runs on a real `VllmConfig` of the installed vLLM, built once per process on the CPU
platform for a tiny local model (a Llama `config.json` written to a temporary directory, no
weights, no tokenizer, no network) and deep-copied per case; the figures a request states are
then set on the copy's own fields (`model_config.max_model_len`, `cache_config.kv_cache_layout`,
`scheduler_config.max_num_batched_tokens`, `parallel_config.decode_context_parallel_size`,
`attention_config.hisparse_config`, `kv_transfer_config`, ...). Two figures a real config derives
from a drafter it cannot build without a draft model are stood in for: `speculative_config` (a
`Speculative` carrying what vLLM's `max_decode_query_len` reads) and the
`num_prefill_lookahead_tokens` property (`CaseConfig` answers the case's value).

Building a `VllmConfig` on a CPU-only machine:
- `VLLM_TARGET_DEVICE=cpu` selects vLLM's CPU platform (set here unless already set).
- vLLM 0.34's `CpuPlatform.check_and_update_config` raises "vLLM on x86 CPUs requires Triton
  (triton-cpu)" when `vllm.triton_utils.HAS_TRITON` is false, and no environment variable skips
  it; `_triton_check_satisfied` sets that flag only while the config is built (planning never
  runs Triton). A stub `triton` module would instead switch on Triton code paths elsewhere.
- vLLM inspects the model class, which imports `einops` (install it in the vLLM venv).
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import functools
import importlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from vllm.config import (  # type: ignore[import-not-found, unused-ignore]
    KVTransferConfig,
    ModelConfig,
    VllmConfig,
)
from vllm.config.attention import (  # type: ignore[import-not-found, unused-ignore]
    HiSparseConfig,
)
from vllm.v1.core import (  # type: ignore[import-not-found, unused-ignore]
    kv_cache_planning as planning,
)
from vllm.v1.core.kv_cache_utils import (  # type: ignore[import-not-found, unused-ignore]
    get_max_concurrency_for_kv_cache_config,
)
from vllm.v1.hisparse import (  # type: ignore[import-not-found, unused-ignore]
    layout as hisparse_layout,
)

from hisparse_plan.adapters.vllm import BUILDER_QUALNAME
from hisparse_plan.adapters.vllm.specs import fresh_layer_spec
from hisparse_plan.models import PlanRequest

DEFAULT_BUILDER = "vllm.v1.core.kv_cache_planning.DefaultKVCacheConfigBuilder"
VLLM_VERSION: str = importlib.import_module("vllm").__version__
IS_034 = VLLM_VERSION.startswith("0.34")

KIND_OF = {
    "UniformTypeKVCacheSpecs": "uniform_type",
    "MLAAttentionSpec": "mla",
    "SlidingWindowMLASpec": "sliding_window_mla",
    "FullAttentionSpec": "full_attention",
    "SlidingWindowSpec": "sliding_window",
    "ChunkedLocalAttentionSpec": "chunked_local_attention",
    "CrossAttentionSpec": "cross_attention",
    "MambaSpec": "mamba",
    "HiSparseResidentSpec": "hisparse_resident",
    "HiSparseHotSpec": "hisparse_hot",
}

TINY_MODEL = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
    "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2,
    "num_hidden_layers": 2, "vocab_size": 1000, "max_position_embeddings": 8192,
    "torch_dtype": "bfloat16", "rms_norm_eps": 1e-5, "head_dim": 64,
}
"""A model vLLM can resolve offline: only its config is read (the layers come from the case)."""


class CaseConfig(VllmConfig):  # type: ignore[misc, unused-ignore]
    """A real `VllmConfig` whose `num_prefill_lookahead_tokens` is the case's figure (a real one
    derives it from a drafter, which needs a draft model)."""

    @property
    def num_prefill_lookahead_tokens(self) -> int:
        lookahead: int = self.__dict__.get("case_lookahead_tokens", 0)
        return lookahead


@dataclass
class Speculative:
    """What vLLM's `max_decode_query_len` and the planner read of a `SpeculativeConfig`: 0.33
    answers 1 + K, 0.34 1 + K + max_num_new_slots_for_drafting."""

    num_speculative_tokens: int
    max_num_new_slots_for_drafting: int = 0
    parallel_drafting: bool = False

    def use_eagle_block_drop(self) -> bool:
        return False


@contextlib.contextmanager
def _triton_check_satisfied() -> Iterator[None]:
    """vLLM 0.34's CPU platform refuses x86 without Triton while building a config."""
    triton_utils: Any = importlib.import_module("vllm.triton_utils")
    saved = triton_utils.HAS_TRITON
    triton_utils.HAS_TRITON = True
    try:
        yield
    finally:
        triton_utils.HAS_TRITON = saved


@functools.cache
def base_config() -> Any:
    """One real `VllmConfig` of the installed vLLM on CPU (copy it before changing it)."""
    model_dir = Path(tempfile.mkdtemp(prefix="hisparse_plan_vllm_model_"))
    atexit.register(shutil.rmtree, model_dir, True)
    (model_dir / "config.json").write_text(json.dumps(TINY_MODEL))
    with _triton_check_satisfied():
        model = ModelConfig(model=str(model_dir), max_model_len=4096, skip_tokenizer_init=True)
        return CaseConfig(model_config=model)


def _concurrency(config: Any, batches: int) -> None:
    """vLLM derives max_concurrent_batches from pipeline parallelism and async scheduling."""
    config.scheduler_config.async_scheduling = batches == 2
    config.parallel_config.pipeline_parallel_size = 1 if batches == 2 else batches
    if config.max_concurrent_batches != batches:
        raise ValueError(f"max_concurrent_batches {batches} cannot be set on this config")


@dataclass
class VllmInputs:
    """What vLLM's engine hands its planner for one request: every layer's spec, and per
    pipeline stage (one worker each) its layers and KV cache memory."""

    specs: dict[str, Any]
    config: Any
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
    config: Any


def inexpressible(request: dict[str, Any]) -> str | None:
    """Why the installed vLLM cannot state this request, or None."""
    aligned = any(layer.get("state_alignment", 1) != 1 for layer in request["layers"].values())
    if aligned and not IS_034:
        return f"vLLM {VLLM_VERSION}'s MambaSpec has no state_alignment"
    return None


def vllm_inputs(request: dict[str, Any]) -> VllmInputs:
    """vLLM spec objects and engine config equivalent to a plan request (SPEC 4, 4.1)."""
    validated = PlanRequest.model_validate(request)
    model = validated.model
    specs = {
        name: fresh_layer_spec(spec, 0, model.mamba_cache_mode)
        for name, spec in validated.layers.items()
    }
    device = validated.device
    scheduler = validated.scheduler
    hisparse = validated.hisparse
    config = copy.deepcopy(base_config())
    config.model_config.max_model_len = model.max_model_len
    config.model_config.original_max_model_len = (
        -1 if model.auto_fit_max_model_len else model.max_model_len
    )
    config.model_config.hf_config.index_topk = model.index_topk
    cache = config.cache_config
    cache.kv_cache_layout = device.kv_cache_layout.value
    cache.num_gpu_blocks_override = device.num_blocks_override
    cache.mamba_cache_mode = model.mamba_cache_mode
    config.scheduler_config.max_num_batched_tokens = scheduler.max_num_batched_tokens
    # SchedulerConfig.__post_init__ copies max_num_batched_tokens into the encoder budget that
    # sizes cross-attention (CrossAttentionSpec.max_memory_usage_bytes); the copy here must too.
    config.scheduler_config.max_num_encoder_input_tokens = scheduler.max_num_batched_tokens
    config.scheduler_config.disable_hybrid_kv_cache_manager = (
        scheduler.disable_hybrid_kv_cache_manager
    )
    config.parallel_config.decode_context_parallel_size = scheduler.decode_context_parallel_size
    _concurrency(config, scheduler.max_concurrent_batches)
    config.case_lookahead_tokens = scheduler.num_prefill_lookahead_tokens
    config.speculative_config = None
    if hisparse is not None:
        config.attention_config.hisparse_config = HiSparseConfig(
            device_buffer_size=hisparse.device_buffer_size
        )
        config.kv_transfer_config = KVTransferConfig(
            kv_connector="HiSparseConnector", kv_role="kv_both",
            kv_connector_extra_config={"host_pool_gib": hisparse.host_pool_gib},
        )
        if hisparse.max_decode_query_len > 1:
            config.speculative_config = Speculative(hisparse.max_decode_query_len - 1)
    shared = hisparse is not None and hisparse.shared_host_pool
    stages = None if device.pipeline_stages is None else [
        (list(stage.layers), stage.available_bytes) for stage in device.pipeline_stages
    ]
    return VllmInputs(
        _with_derived(specs, config), config, device.available_bytes, shared, stages
    )


def _with_derived(specs: dict[str, Any], config: Any) -> dict[str, Any]:
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
