"""A vLLM `KVCacheConfigBuilder` that plans through hisparse_plan.

Importing this module imports vLLM (it subclasses vLLM's interface); vLLM resolves the class by
its qualified name (`hisparse_plan.adapters.vllm.BUILDER_QUALNAME`). Builders are stateless:
vLLM makes a fresh one per call.

- `get_kv_cache_groups` plans the layers with `plan()` and hands back the plan's groups as vLLM
  groups (the engine's spec objects kept). Grouping must not depend on memory, which vLLM sizes
  later, so this plan gets room enough for any admission and host check.
- `get_kv_cache_config_from_groups` sizes and places the groups it is given for `num_blocks`
  blocks with the planner's size and place stages (see `placement`).
"""

from __future__ import annotations

import dataclasses
import importlib

from vllm.v1.core.kv_cache_config_builder import (  # type: ignore[import-not-found, unused-ignore]
    KVCacheConfigBuilder,
)

from hisparse_plan.adapters.vllm.kv_cache_config import assemble, vllm_groups
from hisparse_plan.adapters.vllm.placement import HostSettings, place_groups
from hisparse_plan.adapters.vllm.settings import (
    EngineSettings,
    request_from_settings,
    settings_from_vllm,
)
from hisparse_plan.adapters.vllm.types import VllmObject
from hisparse_plan.models import KVCacheLayout
from hisparse_plan.planning import plan

ROOMY_DEVICE_BYTES = 2**62
ROOMY_HOST_BYTES = 2**61
"""Memory for the grouping plan: far beyond any request, within int64 byte offsets."""


def grouping_settings(settings: EngineSettings) -> EngineSettings:
    """The settings a grouping-only plan uses: no override, no auto-fit, a roomy host pool."""
    hisparse = settings.hisparse
    return dataclasses.replace(
        settings,
        num_blocks_override=None,
        auto_fit_max_model_len=False,
        hisparse=None if hisparse is None
        else dataclasses.replace(hisparse, host_pool_bytes=ROOMY_HOST_BYTES),
    )


class HisparsePlanKVCacheConfigBuilder(KVCacheConfigBuilder):  # type: ignore[misc, unused-ignore]
    """vLLM's planning hooks, answered by hisparse_plan."""

    def get_kv_cache_groups(
        self, vllm_config: VllmObject, kv_cache_spec: dict[str, VllmObject]
    ) -> list[VllmObject]:
        if not kv_cache_spec:
            return []
        hisparse = vllm_config.attention_config.hisparse_config is not None
        settings = settings_from_vllm(vllm_config, ROOMY_HOST_BYTES if hisparse else None)
        request = request_from_settings(
            kv_cache_spec, grouping_settings(settings), ROOMY_DEVICE_BYTES
        )
        return vllm_groups(plan(request), kv_cache_spec)

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
            layout_module = importlib.import_module("vllm.v1.hisparse.layout")
            host = HostSettings(
                budget_bytes=int(layout_module.get_hisparse_host_pool_bytes(vllm_config)),
                shared=bool(layout_module.use_shared_hisparse_host_pool(vllm_config)),
                max_model_len=vllm_config.model_config.max_model_len,
            )
        layout = KVCacheLayout(vllm_config.cache_config.get_resolved_kv_cache_layout().name)
        extra = max(0, vllm_config.num_prefill_lookahead_tokens - 1)
        placed = place_groups(kv_cache_groups, layout, num_blocks, extra, host)
        # vLLM lists the host group first.
        groups = [group for group in kv_cache_groups if group.host_resident] + [
            group for group in kv_cache_groups if not group.host_resident
        ]
        return assemble(num_blocks, placed.tensors, groups, placed.host_pool, retention)
