"""The engines a plan is for: vLLM (the default) and SGLang. Each is a target with its own
flags and its own figures; `--engine` picks one (`plan`) or several side by side
(`capacity`). A flag that only one engine reads, given without that engine, is refused by
name."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from hisparse_plan.cli.errors import CommandError
from hisparse_plan.cli.sglang.source import SGLANG_ONLY, resolve_sglang_source
from hisparse_plan.cli.vllm.source import resolve_source
from hisparse_plan.models.sglang_plan import SGLangPlan
from hisparse_plan.operator.node import Ranks, node_figures
from hisparse_plan.targets.sglang.hisparse_meta import metadata_bytes
from hisparse_plan.targets.sglang.pipeline import plan_traced as plan_sglang_traced
from hisparse_plan.targets.vllm import plan as plan_vllm

VLLM_ONLY: Final[tuple[tuple[str, str], ...]] = (
    ("request", "--request"),
    ("specs_from_vllm", "--specs-from-vllm"),
    ("host_pool", "--host-pool"),
    ("spec_tokens", "--spec-tokens"),
    ("device_buffer", "--device-buffer"),
    ("layout", "--layout"),
    ("block_size", "--block-size"),
    ("max_num_seqs", "--max-num-seqs"),
    ("max_num_batched_tokens", "--max-num-batched-tokens"),
    ("max_concurrent_batches", "--max-concurrent-batches"),
    ("num_gpu_blocks_override", "--num-gpu-blocks-override"),
    ("no_hisparse", "--no-hisparse"),
    ("pp", "--pipeline-parallel-size"),
    ("enable_expert_parallel", "--enable-expert-parallel"),
    ("stage_gpu_mem", "--stage-gpu-mem"),
    ("auto_fit", "--auto-fit"),
    ("gpu_memory_utilization", "--gpu-memory-utilization"),
    ("activation_reserve", "--activation-reserve"),
    ("extensible_kv_cache", "--enable-extensible-kv-cache"),
    ("speculative", "--speculative"),
    ("vllm", "--vllm"),
    ("prefix_caching", "--enable-prefix-caching"),
    ("hybrid_manager", "--enable-hybrid-kv-cache-manager"),
    ("dcp", "--decode-context-parallel-size"),
    ("sweep", "--sweep"),
    ("points", "--points"),
    ("plot", "--plot"),
    ("compare", "--compare"),
    ("node_gpus", "--node-gpus"),
    ("plot_memory", "--plot-memory"),
)
"""(dest, flag) of every flag only the vLLM target reads."""


@dataclass(frozen=True, slots=True)
class Figures:
    """One engine's pools for a model on one rank, in the units both engines share."""

    engine: str
    kv_dtype: str
    page_tokens: int
    device_tokens: int
    """Tokens the device pools hold (vLLM: blocks x block size; SGLang: max_total_num_tokens)."""
    bytes_per_token: float
    device_bytes: int
    budget_bytes: int
    context_length: int
    max_concurrency: float
    steady_state_concurrency: float | None
    request_slots: int | None
    """Requests the engine runs at once (None: not capped by the plan)."""
    host_bytes: int | None
    dp: int = 1
    """Data-parallel ranks, each an engine with its own pools and requests."""
    node_concurrency: float | None = None
    """Concurrent requests all the DP ranks serve (None: the engine's plan does not count
    them)."""
    node_device_bytes: int | None = None
    """Every GPU's device pools (tp x pp x dp ranks)."""
    node_host_bytes: int | None = None
    """Every host pool's budget (HiSparse)."""
    beside_pools_bytes: int | None = None
    """Device bytes the engine allocates beside its KV pools and outside the budget (SGLang:
    the request-to-token table, and HiSparse's coordinator and allocator tables); None: not
    planned."""
    beside_pools_host_bytes: int | None = None
    """Host bytes beside the host pool (SGLang HiSparse's slot and per-request tables, in
    pageable memory); None: none planned."""
    defaults: str = ""
    """The engine's defaults for this GPU and model, in words ("" where none is said)."""


@dataclass(frozen=True, slots=True)
class Engine:
    name: str
    title: str
    only: tuple[tuple[str, str], ...]
    figures: Callable[[argparse.Namespace], Figures]


def _given(value: object) -> bool:
    return value is not None and value is not False


def _vllm_dtype(kv_dtype: str | None, spec: object) -> str:
    if kv_dtype is not None:
        return kv_dtype
    return str(getattr(spec, "dtype", "-"))


def _vllm_figures(args: argparse.Namespace) -> Figures:
    source = resolve_source(args)
    result = plan_vllm(source.request)
    spec = result.groups[0].spec
    device = result.device_pool
    host = result.host_pool
    block = spec.block_size
    ranks = Ranks(tp=args.tp or 1, pp=len(result.device_pools), dp=args.dp or 1)
    node = node_figures(result, ranks, args.max_num_seqs)
    return Figures(
        engine="vllm", kv_dtype=_vllm_dtype(source.kv_dtype, spec), page_tokens=block,
        device_tokens=result.num_blocks * block,
        bytes_per_token=device.bytes_per_block / block,
        device_bytes=device.size, budget_bytes=device.available_bytes,
        context_length=result.workload.max_model_len,
        max_concurrency=result.capacity.max_concurrency,
        steady_state_concurrency=result.capacity.steady_state_concurrency,
        request_slots=args.max_num_seqs, host_bytes=None if host is None else host.size,
        dp=ranks.dp, node_concurrency=node.max_concurrency,
        node_device_bytes=node.kv_cache_bytes, node_host_bytes=node.host_pool_bytes,
    )


def sglang_device_bytes(plan: SGLangPlan) -> int:
    """Bytes of every device pool (a per-layer pool once per layer)."""
    return sum(pool.size * len(plan.allocation_layers(pool)) for pool in plan.pools
               if pool.location == "device")


def sglang_request_table_bytes(plan: SGLangPlan) -> int:
    """Bytes of SGLang's request-to-token table (int32), allocated beside the KV budget."""
    table = plan.req_to_token
    return table.shape[0] * table.shape[1] * 4


def sglang_host_bytes(plan: SGLangPlan) -> int | None:
    host = [pool.size for pool in plan.pools if pool.location == "host"]
    return sum(host) if host else None


def _sglang_figures(args: argparse.Namespace) -> Figures:
    source = resolve_sglang_source(args)
    traced = plan_sglang_traced(source.request)
    result = traced.plan
    engine = source.request.engine
    if engine is None:  # resolve_sglang_source always sets it
        raise CommandError("--engine sglang: the request carries no SGLang settings")
    kv = next((t for t in result.tensors if t.pool == "kv"), result.tensors[0])
    # SGLang's platform defaults, and with speculative decoding the draft it resolved.
    applied = {d.subject: d for d in traced.trace.decisions
               if d.rule in ("sglang.platform", "sglang.speculative")}
    dtype: str = engine.kv_cache_dtype
    if "kv_cache_dtype" in applied:
        dtype = f"{dtype} -> {applied['kv_cache_dtype'].value}"
    return Figures(
        engine="sglang", kv_dtype=f"{dtype} ({kv.views[0].dtype} rows)",
        page_tokens=result.page_size, device_tokens=result.max_total_num_tokens,
        bytes_per_token=float(result.budget.cell_size_bytes),
        device_bytes=sglang_device_bytes(result), budget_bytes=result.budget.available_bytes,
        context_length=engine.context_length,
        max_concurrency=result.capacity.max_concurrency,
        steady_state_concurrency=result.capacity.steady_state_concurrency,
        request_slots=result.max_running_requests, host_bytes=sglang_host_bytes(result),
        beside_pools_bytes=sglang_request_table_bytes(result)
        + metadata_bytes(result.hisparse, "device"),
        beside_pools_host_bytes=metadata_bytes(result.hisparse, "host") or None,
        defaults="; ".join(f"{d.subject} {d.value} ({d.why})" for d in applied.values()),
    )


VLLM: Final = Engine("vllm", "vLLM", VLLM_ONLY, _vllm_figures)
SGLANG: Final = Engine("sglang", "SGLang 0.5.23", SGLANG_ONLY, _sglang_figures)
ENGINES: Final[dict[str, Engine]] = {engine.name: engine for engine in (VLLM, SGLANG)}


def engine_list(text: str) -> tuple[str, ...]:
    """`vllm`, `sglang` or `vllm,sglang`: each once."""
    names = tuple(part.strip().lower() for part in text.split(","))
    unknown = [name for name in names if name not in ENGINES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"expected engines from {', '.join(ENGINES)} separated by commas, got {text!r}")
    if len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"expected each engine once, got {text!r}")
    return names


def add_engine_choice(parser: argparse.ArgumentParser, *, several: bool) -> None:
    help_text = ("the engines to plan for, side by side: vllm, sglang or vllm,sglang "
                 "(default vllm)" if several else
                 "the engine to plan for: vllm (default) or sglang")
    parser.add_argument("--engine", type=engine_list, metavar="NAME" + (",..." if several
                                                                         else ""),
                        help=help_text)


def chosen_engines(args: argparse.Namespace, *, several: bool) -> list[Engine]:
    """The engines `--engine` names (vLLM without it); a flag another engine only reads is
    refused, naming it and its engine."""
    names: Sequence[str] = args.engine or ("vllm",)
    if not several and len(names) > 1:
        raise CommandError(f"--engine: plan prints one engine's plan; expected vllm or sglang, "
                           f"got {','.join(names)} (compare engines with `capacity`)")
    engines = [ENGINES[name] for name in names]
    for other in ENGINES.values():
        if other in engines:
            continue
        for dest, flag in other.only:
            if _given(getattr(args, dest, None)):
                raise CommandError(
                    f"{flag} applies to {other.title} only; expected --engine {other.name} "
                    f"with it, got --engine {','.join(names)}")
    return engines
