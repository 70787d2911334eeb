"""A vLLM `KVCacheConfigBuilder` that plans through hisparse_plan.

Importing this module imports vLLM (it subclasses vLLM's interface); vLLM resolves the class by
its qualified name (`hisparse_plan.adapters.vllm.BUILDER_QUALNAME`). Builders are stateless:
vLLM makes a fresh one per call.

- `get_kv_cache_groups` runs the planner's group stage (SPEC 5.2-5.6, 7.3) on the layers and
  hands back its groups as vLLM groups (the engine's spec objects kept).
- `get_kv_cache_config_from_groups` sizes and places the groups it is given for `num_blocks`
  blocks with the planner's size and place stages (see `placement`), and refuses a placement
  the kernels of vLLM's backends would assert against (see `kernel_contracts`).
"""

from __future__ import annotations

from vllm.v1.core.kv_cache_config_builder import (  # type: ignore[import-not-found, unused-ignore]
    KVCacheConfigBuilder,
)

from hisparse_plan.adapters.vllm.kernel_contracts import check_placed_strides, engine_capability
from hisparse_plan.adapters.vllm.kv_cache_config import assemble, vllm_groups
from hisparse_plan.adapters.vllm.placement import HostSettings, place_groups
from hisparse_plan.adapters.vllm.settings import (
    hisparse_host_budget,
    request_from_settings,
    settings_from_vllm,
    shared_host_pool,
)
from hisparse_plan.adapters.vllm.types import VllmObject
from hisparse_plan.models import KVCacheLayout, PlanRequest
from hisparse_plan.models.base import GIB
from hisparse_plan.targets.trace import Trace
from hisparse_plan.targets.vllm.groups import PlannedGroup
from hisparse_plan.targets.vllm.hisparse_groups import hisparse_groups
from hisparse_plan.targets.vllm.one_manager import one_manager_layers
from hisparse_plan.targets.vllm.pipeline import request_layers
from hisparse_plan.targets.vllm.regular_groups import regular_groups


def planned_groups(request: PlanRequest) -> list[PlannedGroup]:
    """The groups `plan()` would make, from its group stage alone: grouping never depends on
    memory or on the pipeline stages, which vLLM sizes and checks per worker later."""
    layers = request_layers(request)
    if request.scheduler.disable_hybrid_kv_cache_manager:
        # One KV cache manager: local layers promoted before grouping, as plan() does.
        layers = one_manager_layers(layers, Trace())
    if request.hisparse is None:
        return regular_groups(layers, request.device.kv_cache_layout, Trace())
    grouping = hisparse_groups(request, request.hisparse, layers, Trace())
    return [grouping.source, *grouping.device]


class HisparsePlanKVCacheConfigBuilder(KVCacheConfigBuilder):  # type: ignore[misc, unused-ignore]
    """vLLM's planning hooks, answered by hisparse_plan."""

    def get_kv_cache_groups(
        self, vllm_config: VllmObject, kv_cache_spec: dict[str, VllmObject]
    ) -> list[VllmObject]:
        if not kv_cache_spec:
            return []
        # Neither the host budget nor the memory takes part in grouping: vLLM reads them later.
        settings = settings_from_vllm(vllm_config, host_pool_bytes=GIB)
        request = request_from_settings(kv_cache_spec, settings, available_bytes=0)
        groups = [planned.group for planned in planned_groups(request)]
        converted: list[VllmObject] = vllm_groups(
            groups, settings.extra_window_tokens, kv_cache_spec, settings.mamba_cache_mode
        )
        return converted

    def get_kv_cache_config_from_groups(
        self, vllm_config: VllmObject, kv_cache_groups: list[VllmObject], num_blocks: int
    ) -> VllmObject:
        retention = vllm_config.cache_config.prefix_cache_retention_interval
        if not kv_cache_groups:
            # No KV cache: the block pool still needs its null block.
            return assemble(1, [], kv_cache_groups, None, retention)
        override = vllm_config.cache_config.num_gpu_blocks_override
        if override is not None:
            # As vLLM's default builder: the override wins over the block count it is given.
            num_blocks = override
        host = None
        if vllm_config.attention_config.hisparse_config is not None:
            host = HostSettings(
                budget_bytes=hisparse_host_budget(vllm_config),
                shared=shared_host_pool(vllm_config),
                max_model_len=vllm_config.model_config.max_model_len,
            )
        layout = KVCacheLayout(vllm_config.cache_config.get_resolved_kv_cache_layout().name)
        extra = max(0, vllm_config.num_prefill_lookahead_tokens - 1)
        placed = place_groups(kv_cache_groups, layout, num_blocks, extra, host)
        # The kernels of the backends vLLM runs would assert on these strides in every worker.
        check_placed_strides(vllm_config, placed.layers, placed.tensors, engine_capability())
        # vLLM lists the host group first.
        groups = [group for group in kv_cache_groups if group.host_resident] + [
            group for group in kv_cache_groups if not group.host_resident
        ]
        return assemble(num_blocks, placed.tensors, groups, placed.host_pool, retention)
