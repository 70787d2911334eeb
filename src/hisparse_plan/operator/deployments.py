"""Deployments of one model side by side: GPU x tensor-parallel x data-parallel x KV-cache
dtype (x HiSparse on and off, for a sparse-MLA model), each planned for real.

A deployment is one node's worth of ranks serving one model. Each rank's KV-cache memory is
what its GPU has left after vLLM's share, the rank's weights and the activation reserve
(`presets.hardware.memory_breakdown`, with the chosen vLLM's own gpu_memory_utilization), or a
size given for every GPU. One plan is one rank's; `operator.node` counts it over the
deployment: with DP attention each DP rank holds its own requests, so the node serves `dp x`
one rank's concurrency (capped per rank by `max_num_seqs`), and with HiSparse each DP rank has
its own host pool, shared by its TP ranks. Whatever refuses a
deployment (weights that leave no KV cache, heads that do not divide, a request that does not
fit) is recorded as its refusal, and the others still plan.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

from pydantic import Field

from hisparse_plan.errors import PlanError
from hisparse_plan.models import KVCachePlan
from hisparse_plan.models.base import ByteCount, Model, PositiveInt
from hisparse_plan.models.plan import Concurrency
from hisparse_plan.operator.bounds import Binding, pool_bounds
from hisparse_plan.operator.engines import engine_version, make_plan
from hisparse_plan.operator.node import Ranks, node_figures
from hisparse_plan.presets import Architecture, ModelArchitecture, Settings, build_request
from hisparse_plan.presets.catalog import Weights
from hisparse_plan.presets.hardware import (
    DEFAULT_ACTIVATION_RESERVE,
    MemorySizing,
    find_gpu,
    memory_breakdown,
    memory_sizing,
)
from hisparse_plan.presets.kv_dtypes import VLLMKVCacheDtype, resolve_kv_cache_dtype
from hisparse_plan.presets.settings import DEFAULTS

DEFAULT_GPUS = ("h100", "h200", "b200")
DEFAULT_KV_CACHE_DTYPES: tuple[VLLMKVCacheDtype, ...] = ("auto", "fp8")
NODE_GPUS = 8
"""GPUs of one node: the default grid's tp x dp x pp fills it."""


class Deployment(Model):
    """One way to serve the model: which GPU, how the ranks split, which cache."""

    gpu: str | None = Field(description="GPU name; null when the KV memory per GPU was given.")
    tp: PositiveInt = Field(description="Tensor-parallel ranks (vLLM -tp).")
    dp: PositiveInt = Field(description="Data-parallel ranks, each with its own requests (-dp).")
    pp: PositiveInt = Field(description="Pipeline stages (-pp).")
    kv_cache_dtype: VLLMKVCacheDtype = Field(description="As vLLM's --kv-cache-dtype.")
    hisparse: bool = Field(description="The source cache in a host pool (sparse-MLA models).")


class RankMemory(Model):
    """Where one rank's GPU memory goes, in bytes; the parts add up to `hbm`."""

    hbm: ByteCount
    held_back: ByteCount = Field(description="hbm - ceil(hbm * gpu_memory_utilization).")
    weights: ByteCount = Field(description="The rank's share of the weights (an estimate).")
    activation_reserve: ByteCount
    kv_cache_pool: ByteCount = Field(description="Stage 0's device pool: whole blocks.")
    kv_cache_left_over: ByteCount = Field(description="KV-cache memory under one block.")


class DeploymentResult(Model):
    """One deployment planned, or why it was refused."""

    deployment: Deployment
    kv_dtype: str | None = Field(description="The cache dtype planned (fp8 resolved per model).")
    kv_cache_bytes: ByteCount | None = Field(description="KV-cache memory of one GPU.")
    max_model_len: PositiveInt | None = Field(description="The length planned (auto-fitted).")
    per_rank_concurrency: Concurrency | None = Field(
        description="Concurrent max_model_len requests one DP rank serves: its plan's "
        "max_concurrency, capped by max_num_seqs."
    )
    node_concurrency: Concurrency | None = Field(
        description="dp x per_rank_concurrency: what the whole deployment serves."
    )
    node_kv_cache_bytes: ByteCount | None = Field(
        default=None,
        description="Every GPU's KV-cache pools: each stage's pool x tp x dp.",
    )
    node_host_pool_bytes: ByteCount | None = Field(
        default=None,
        description="HiSparse: the host DRAM of all the deployment's host pools (one per DP "
        "rank when its TP ranks share it).",
    )
    binding: Binding | Literal["gpu"] | None = Field(
        description="What caps the plan: the host pool, the device pool, both (HiSparse), or "
        "gpu for a regular plan."
    )
    host_pool_bytes: ByteCount | None = Field(
        description="HiSparse: the host pool of one DP rank (shared by its TP ranks)."
    )
    memory: RankMemory | None = Field(
        description="One rank's GPU memory, with a GPU whose memory the weights leave some of."
    )
    refusal: str | None = Field(description="Why this deployment cannot be planned.")


class DeploymentComparison(Model):
    """Every deployment of the grid, in grid order."""

    model: str
    max_num_seqs: PositiveInt | None
    results: list[DeploymentResult]
    sizing: str | None = Field(
        default=None,
        description="How a deployment with a GPU got its KV memory: vLLM's version, sizing mode "
        "and gpu_memory_utilization; null when every GPU's KV memory was given.",
    )


def deployment_grid(
    *,
    gpus: tuple[str | None, ...],
    tps: tuple[int, ...] | None,
    dps: tuple[int, ...] | None,
    pp: int,
    kv_cache_dtypes: tuple[VLLMKVCacheDtype, ...],
    hisparse: tuple[bool, ...],
    node_gpus: int = NODE_GPUS,
) -> list[Deployment]:
    """Every combination, GPU outermost. An axis left None is filled so that tp x dp x pp is
    `node_gpus` (both None: every power-of-two tp that divides the node)."""
    if tps is None and dps is None:
        pairs = [(tp, node_gpus // (tp * pp)) for tp in _divisors(node_gpus // pp)]
    elif dps is None:
        pairs = [(tp, max(1, node_gpus // (tp * pp))) for tp in tps or ()]
    elif tps is None:
        pairs = [(max(1, node_gpus // (dp * pp)), dp) for dp in dps]
    else:
        pairs = [(tp, dp) for tp in tps for dp in dps]
    return [
        Deployment(gpu=gpu, tp=tp, dp=dp, pp=pp, kv_cache_dtype=dtype, hisparse=on)
        for gpu in gpus
        for tp, dp in pairs
        for dtype in kv_cache_dtypes
        for on in hisparse
    ]


def _divisors(count: int) -> list[int]:
    return [2**k for k in range(count.bit_length()) if count % 2**k == 0]


def compare_deployments(
    model: str,
    arch: Architecture,
    grid: list[Deployment],
    settings: Settings,
    *,
    weights: Weights | int | None,
    gpu_memory_utilization: str | None = None,
    activation_reserve: int = DEFAULT_ACTIVATION_RESERVE,
    expert_parallel: bool = False,
    max_num_seqs: int | None = None,
    auto_max_model_len: bool = False,
) -> DeploymentComparison:
    """Plan `arch` for every deployment of `grid`, the rest as `settings` say.

    A deployment with a GPU takes its KV memory from the GPU (which needs `weights`); one
    without takes `settings.gpu_mem_bytes` (or the preset default). A GPU's share is
    `gpu_memory_utilization`, else the default of the vLLM `settings` choose (0.34: 1.0 with its
    extensible KV cache). `expert_parallel` splits the weights over tp x dp ranks (vLLM's
    --enable-expert-parallel), else over tp. `auto_max_model_len` fits max_model_len to each
    deployment's memory, as vLLM's auto.
    """
    sizing = memory_sizing(engine_version(settings), gpu_memory_utilization=gpu_memory_utilization)
    results = [
        _planned(arch, deployment, settings, weights, sizing,
                 activation_reserve, expert_parallel, max_num_seqs, auto_max_model_len)
        for deployment in grid
    ]
    with_gpu = any(deployment.gpu is not None for deployment in grid)
    return DeploymentComparison(model=model, max_num_seqs=max_num_seqs, results=results,
                                sizing=sizing.words if with_gpu else None)


def _planned(
    arch: Architecture,
    deployment: Deployment,
    settings: Settings,
    weights: Weights | int | None,
    sizing: MemorySizing,
    reserve: int,
    expert_parallel: bool,
    max_num_seqs: int | None,
    auto: bool,
) -> DeploymentResult:
    refused = DeploymentResult(
        deployment=deployment, kv_dtype=None, kv_cache_bytes=None, max_model_len=None,
        per_rank_concurrency=None, node_concurrency=None, binding=None, host_pool_bytes=None,
        memory=None, refusal=None,
    )
    sparse_mla = isinstance(arch, ModelArchitecture) or arch.compressed_mla
    breakdown = None
    try:
        kv_dtype = resolve_kv_cache_dtype(deployment.kv_cache_dtype, sparse_mla=sparse_mla)
        kv_bytes: int = settings.gpu_mem_bytes or DEFAULTS.gpu_mem_bytes or 0
        if deployment.gpu is not None:
            if weights is None:
                raise PlanError(
                    "gpu: this model has no parameter count to estimate its weights from; "
                    "expected a preset with weights, or the KV memory per GPU (--gpu-mem)",
                    field="gpu",
                )
            shards = deployment.tp * (deployment.dp if expert_parallel else 1)
            breakdown = memory_breakdown(
                find_gpu(deployment.gpu), weights, tp=shards, pp=deployment.pp,
                activation_reserve=reserve, sizing=sizing,
            )
            kv_bytes = breakdown.kv_cache
        chosen = replace(
            settings, kv_dtype=kv_dtype, tp=deployment.tp, pp=deployment.pp,
            gpu_mem_bytes=kv_bytes, stage_gpu_mem_bytes=None,
            hisparse=None if deployment.hisparse else False,
            host_pool_bytes=settings.host_pool_bytes if deployment.hisparse else None,
            device_buffer_size=settings.device_buffer_size if deployment.hisparse else None,
            auto_fit=True if auto else settings.auto_fit,
        )
        plan = make_plan(build_request(arch, chosen))
    except PlanError as error:
        # Where the weights fit but the plan is refused, the GPU's memory is still shown: its
        # KV-cache memory all left over.
        memory = None if breakdown is None else RankMemory(
            hbm=breakdown.hbm, held_back=breakdown.held_back, weights=breakdown.weights,
            activation_reserve=breakdown.activation_reserve, kv_cache_pool=0,
            kv_cache_left_over=breakdown.kv_cache,
        )
        return refused.model_copy(update={
            "refusal": " ".join(str(error).split()), "memory": memory,
            "kv_cache_bytes": None if breakdown is None else breakdown.kv_cache,
        })
    node = node_figures(
        plan, Ranks(tp=deployment.tp, pp=len(plan.device_pools), dp=deployment.dp), max_num_seqs
    )
    memory = None
    if breakdown is not None:
        pool = plan.device_pools[0].size
        memory = RankMemory(
            hbm=breakdown.hbm, held_back=breakdown.held_back, weights=breakdown.weights,
            activation_reserve=breakdown.activation_reserve, kv_cache_pool=pool,
            kv_cache_left_over=kv_bytes - pool,
        )
    return DeploymentResult(
        deployment=deployment,
        kv_dtype=kv_dtype,
        kv_cache_bytes=kv_bytes,
        max_model_len=plan.max_model_len,
        per_rank_concurrency=node.per_dp_rank_concurrency,
        node_concurrency=node.max_concurrency,
        node_kv_cache_bytes=node.kv_cache_bytes,
        node_host_pool_bytes=node.host_pool_bytes,
        binding=_binding(plan),
        host_pool_bytes=None if plan.host_pool is None else plan.host_pool.budget_bytes,
        memory=memory,
        refusal=None,
    )


def _binding(plan: KVCachePlan) -> Binding | Literal["gpu"]:
    return "gpu" if plan.host_pool is None else pool_bounds(plan).binding("max")
