"""A plan as vLLM's `KVCacheConfig` (0.33 or 0.34; one per pipeline stage), field for field."""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping, Sequence

from hisparse_plan.adapters.vllm import specs
from hisparse_plan.adapters.vllm.types import VllmObject
from hisparse_plan.errors import PlanError
from hisparse_plan.models import HostPool, KVCacheGroup, KVCachePlan, KVCacheTensor
from hisparse_plan.models.any_plan import expect_plan


def vllm_tensor(tensor: KVCacheTensor) -> VllmObject:
    return specs.interface().KVCacheTensor(
        size=tensor.size,
        layers=list(tensor.layers),
        layer_stride=tensor.layer_stride,
        block_stride=tensor.block_stride,
        offset=tensor.offset,
        host_resident=tensor.host_resident,
    )


def assemble(
    num_blocks: int,
    tensors: Sequence[KVCacheTensor],
    groups: list[VllmObject],
    host_pool: HostPool | None,
    prefix_cache_retention_interval: int | None,
) -> VllmObject:
    """The KVCacheConfig of vLLM groups placed as `tensors`."""
    return specs.interface().KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[vllm_tensor(tensor) for tensor in tensors],
        kv_cache_groups=groups,
        prefix_cache_retention_interval=prefix_cache_retention_interval,
        hisparse_host_num_blocks=None if host_pool is None else host_pool.num_blocks,
        hisparse_host_block_stride=None if host_pool is None else host_pool.block_stride,
        hisparse_shared_host_pool=False if host_pool is None else host_pool.shared,
    )


def vllm_groups(
    groups: Sequence[KVCacheGroup],
    extra_tokens: int,
    layer_specs: Mapping[str, VllmObject] | None = None,
    mamba_cache_mode: str = "none",
) -> list[VllmObject]:
    """vLLM's KVCacheGroupSpec list for our groups (sliding windows keep `extra_tokens`)."""
    builder = specs.SpecBuilder(extra_tokens, layer_specs, mamba_cache_mode)
    return [builder.group(group) for group in groups]

def share_kv_cache_zeroing(configs: Sequence[VllmObject]) -> None:
    """vLLM 0.34 resolves `needs_kv_cache_zeroing` across the workers (every worker receives
    the scheduler's blocks to zero): one stage's Mamba layers make every stage zero. vLLM 0.33
    derives it per config (a read-only property, over every group, empty ones included), so
    there is nothing to share."""
    config_fields = {field.name for field in dataclasses.fields(specs.interface().KVCacheConfig)}
    if "needs_kv_cache_zeroing" not in config_fields:
        return
    needed = any(config.needs_kv_cache_zeroing for config in configs)
    for config in configs:
        config.needs_kv_cache_zeroing = needed


def fill_tp_replicas(
    configs: Sequence[VllmObject], tensor_parallel_size: int, dcp_size: int
) -> None:
    """Each config's `kv_tp_replicas` as vLLM's `get_kv_cache_configs` sets it: its own
    `kv_cache_groups_tp_replicas` over the config's groups (the consecutive TP ranks holding
    identical KV for every layer: an MLA latent, `max_tp_shards` 1, is the same on all of
    them), which KV offloading reads to store a replicated layout once."""
    if isinstance(tensor_parallel_size, bool) or not isinstance(tensor_parallel_size, int) or (
        tensor_parallel_size < 1
    ):
        raise PlanError(
            f"tensor_parallel_size: expected a positive integer, got {tensor_parallel_size!r}",
            field="tensor_parallel_size",
        )
    planning = importlib.import_module("vllm.v1.core.kv_cache_planning")
    for config in configs:
        config.kv_tp_replicas = planning.kv_cache_groups_tp_replicas(
            config.kv_cache_groups, tensor_parallel_size, dcp_size
        )


def to_kv_cache_configs(
    plan: KVCachePlan,
    layer_specs: Mapping[str, VllmObject] | None = None,
    *,
    prefix_cache_retention_interval: int | None = None,
    tensor_parallel_size: int | None = None,
) -> list[VllmObject]:
    """One `KVCacheConfig` per pipeline stage, as vLLM's `get_kv_cache_configs` returns them.

    `layer_specs` (vLLM's own `dict[str, KVCacheSpec]`, optional) lends the rebuilt specs the
    fields the contract does not carry; without it those take vLLM's defaults.
    `tensor_parallel_size` (vLLM's `parallel_config.tensor_parallel_size`, which the plan does
    not carry) fills `kv_tp_replicas` as vLLM does; without it the field keeps vLLM's default
    1. Its answer needs the layers' `max_tp_shards`, which only `layer_specs` carries.
    """
    plan = expect_plan(KVCachePlan, plan, "to_kv_cache_configs")
    configs = _stage_configs(plan, layer_specs, prefix_cache_retention_interval)
    if tensor_parallel_size is not None:
        fill_tp_replicas(configs, tensor_parallel_size,
                         plan.workload.decode_context_parallel_size)
    return configs


def refuse_block_outermost_host(plan: KVCachePlan) -> None:
    """vLLM 0.33/0.34 lay the HiSparse host pool out LBNHC, whatever they are asked
    (`vllm.v1.hisparse.layout.get_hisparse_kv_cache_config` sets `host_layout =
    KVCacheLayout.LBNHC`), and their shared host pool (`HiSparseHostPool.allocate`) registers
    each host layer as a slab of `layer_stride` bytes: a block-outermost host pool is no
    config vLLM makes or allocates, so handing it over would bind another layout than planned."""
    host = plan.host_pool
    if host is not None and host.layout.block_outermost:
        raise PlanError(
            f"hisparse.host_pool_layout: the plan's host pool is {host.layout.value} "
            "('block_outermost'), which vLLM 0.33/0.34's runtime does not lay out (its host "
            "pool is LBNHC); expected 'layer_outermost' for a plan vLLM runs (see "
            "docs/transfer.md#placement-that-transfers-well)",
            field="hisparse.host_pool_layout",
        )


def _stage_configs(
    plan: KVCachePlan,
    layer_specs: Mapping[str, VllmObject] | None,
    prefix_cache_retention_interval: int | None,
) -> list[VllmObject]:
    refuse_block_outermost_host(plan)
    groups = vllm_groups(
        plan.groups, plan.workload.extra_window_tokens, layer_specs, plan.workload.mamba_cache_mode
    )
    if len(plan.device_pools) == 1:
        return [assemble(plan.num_blocks, plan.tensors, groups, plan.host_pool,
                         prefix_cache_retention_interval)]
    project = importlib.import_module("vllm.v1.core.kv_cache_planning")
    configs = []
    for index, pool in enumerate(plan.device_pools):
        names = dict.fromkeys(pool.layers or [])
        tensors = [tensor for tensor in plan.tensors if tensor.layers[0] in names]
        # vLLM's own projection, so a stage's groups are exactly what its workers get.
        stage_groups = project._project_kv_cache_groups_to_worker(groups, names)
        if not tensors:
            raise PlanError(f"device_pools[{index}]: the stage places no tensor",
                            field=f"device_pools[{index}]")
        configs.append(assemble(plan.num_blocks, tensors, stage_groups, plan.host_pool,
                                prefix_cache_retention_interval))
    share_kv_cache_zeroing(configs)
    return configs


def to_kv_cache_config(
    plan: KVCachePlan,
    layer_specs: Mapping[str, VllmObject] | None = None,
    *,
    prefix_cache_retention_interval: int | None = None,
    tensor_parallel_size: int | None = None,
) -> VllmObject:
    """The plan as the `vllm.v1.kv_cache_interface.KVCacheConfig` vLLM plans for the same
    input. A plan with several pipeline stages has one config per stage: see
    `to_kv_cache_configs`."""
    plan = expect_plan(KVCachePlan, plan, "to_kv_cache_config")
    if len(plan.device_pools) != 1:
        raise PlanError(
            f"the plan has {len(plan.device_pools)} pipeline stages, so vLLM has one "
            "KVCacheConfig per stage; expected one stage: use to_kv_cache_configs",
            field="device_pools",
        )
    return to_kv_cache_configs(
        plan, layer_specs, prefix_cache_retention_interval=prefix_cache_retention_interval,
        tensor_parallel_size=tensor_parallel_size,
    )[0]
