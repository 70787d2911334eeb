"""SGLang 0.5.23's default `--mem-fraction-static`, and the defaults it is built from.

When the fraction is not given, SGLang keeps back, in MiB of the GPU's total memory, room for
activations (1.5 MiB per token of a prefill chunk, at least 2048 tokens), 512 MiB of constant
metadata, 128 MiB per rank of the tensor-parallel group (1024 per 8) and what its CUDA graphs
take (2 MiB per decode batch slot; the prefill graphs: 8 MiB per captured token count, or a flat
1536 MiB for MLA models). A GPU of more than 60 GiB keeps back at least 10 GiB. The fraction is
what is left, over the total, rounded to three decimals. The chunk and the largest decode graph
batch themselves default by the GPU's memory.

DP attention keeps 3 MiB (4.5 above a batch of 300) per decode batch slot and attention group
more, and DeepEP's all-to-all 2 GiB more (on top of the 10 GiB floor) with 1 GiB more with
prefill graphs (modes/parallel.py). The chunk is the one before DP attention divides it.

Pipeline stages keep tp x pp / 8 GiB for the parallel groups and capture no prefill graphs by
default (modes/pipeline_stages.py).

Modelled: CUDA GPUs, no disaggregated prefill/decode roles, text-only models, SGLang's
environment defaults (no post-capture KV sizing, no KV-cache sharding), and chunked prefill on.
Every figure is computed with the same float operations in the same order as SGLang, so the
fraction is SGLang's to the bit."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from hisparse_plan.errors import PlanError
from hisparse_plan.models.sglang_settings import SGLangSettings
from hisparse_plan.targets.sglang.modes.parallel import (
    deepep_a2a_mib,
    deepep_prefill_graph_mib,
    dp_attention_graph_mib,
)
from hisparse_plan.targets.sglang.modes.pipeline_stages import prefill_graphs_by_default
from hisparse_plan.targets.sglang.served.multimodal import (
    multimodal_fraction,
    prefill_graphs_allowed,
)

MIB: Final = 1 << 20


@dataclass(frozen=True)
class GPUTier:
    """SGLang's capacity defaults for GPUs below `below_mib` MiB (and above the tier before)."""

    below_mib: float
    chunked_prefill_size: int
    decode_max_bs: int
    """Largest decode graph batch below tensor-parallel size 4."""
    decode_max_bs_tp4: int
    """... and from tensor-parallel size 4 up."""


GPU_TIERS: Final[tuple[GPUTier, ...]] = (
    GPUTier(20 * 1024, 2048, 8, 8),          # T4, RTX 4080
    GPUTier(35 * 1024, 4096, 48, 160),       # A10, RTX 4090 / 5090
    GPUTier(60 * 1024, 4096, 32, 160),       # A100 40GB, L40
    GPUTier(90 * 1024, 8192, 256, 512),      # H100, A100 80GB
    GPUTier(160 * 1024, 8192, 256, 512),     # H20, H200
    GPUTier(float("inf"), 16384, 512, 512),  # B200, MI300X
)
MIN_ACTIVATION_TOKENS: Final = 2048
ACTIVATION_MIB_PER_TOKEN: Final = 1.5
CONSTANT_RESERVE_MIB: Final = 512
PARALLEL_RESERVE_MIB_PER_8_RANKS: Final = 1024
DECODE_GRAPH_MIB_PER_BATCH: Final = 2
PREFILL_GRAPH_MIB_PER_SIZE: Final = 8
MLA_PREFILL_GRAPH_MIB: Final = 1.5 * 1024
MLA_PREFILL_GRAPH_MAX_TOKENS: Final = 8192
LARGE_GPU_MIB: Final = 60 * 1024
LARGE_GPU_MIN_RESERVE_MIB: Final = 10 * 1024
FRACTION_DECIMALS: Final = 3
DEEPEP_PREFILL_GRAPH_TOKENS: Final = 2048


def gpu_memory_mib(total_bytes: int) -> float:
    """The GPU's memory as SGLang's capacity query answers it: nvidia-smi's memory.total, whole
    MiB (bytes floored to MiB), as a float. Not CUDA's own total, which is lower (an H200:
    nvidia-smi 143771 MiB, cudaMemGetInfo 143155 MiB); SGLang reads that one only when
    nvidia-smi fails."""
    return float(total_bytes // MIB)


def gpu_tier(gpu_mib: float) -> GPUTier:
    """The first tier whose bound the GPU's memory is below."""
    return next(tier for tier in GPU_TIERS if gpu_mib < tier.below_mib)


def default_chunked_prefill_size(gpu_mib: float) -> int:
    """Tokens of one prefill chunk when `--chunked-prefill-size` is not given: 2048 below
    20 GiB, 4096 below 60 GiB, 8192 below 160 GiB, else 16384."""
    return gpu_tier(gpu_mib).chunked_prefill_size


def decode_graph_max_bs(gpu_mib: float, tp_size: int, max_running_requests: int | None) -> int:
    """The largest decode batch SGLang captures a graph for, by the GPU's memory (between 20
    and 160 GiB, tensor-parallel size 4 and up gets the larger batch), lowered to a given
    `--max-running-requests`."""
    tier = gpu_tier(gpu_mib)
    max_bs = tier.decode_max_bs if tp_size < 4 else tier.decode_max_bs_tp4
    if max_running_requests is not None and max_bs > max_running_requests:
        max_bs = max_running_requests
    return max_bs


def prefill_graph_max_tokens(
    chunked_prefill_size: int, mla: bool, max_total_tokens: int | None
) -> int:
    """The largest prefill (in tokens) captured as a graph: the chunk size, at most 8192 for MLA
    models, and never above a given `--max-total-tokens`."""
    tokens = chunked_prefill_size
    if mla:
        tokens = min(MLA_PREFILL_GRAPH_MAX_TOKENS, tokens)
    if max_total_tokens is not None:
        tokens = min(tokens, max_total_tokens)
    return tokens


PREFILL_GRAPH_STEPS: Final = ((4, 32, 4), (48, 256, 16), (288, 512, 32), (576, 1024, 64),
                              (1280, 4096, 256))
"""(first, last, step) of the token counts SGLang captures prefill graphs for below 4608."""
PREFILL_GRAPH_TAIL: Final = (4608, 512)
"""From 4608 on, a prefill graph every 512 tokens."""


def prefill_graph_token_counts(max_tokens: int) -> list[int]:
    """The token counts SGLang captures prefill graphs for, up to `max_tokens`: every 4 up to
    32, 16 up to 256, 32 up to 512, 64 up to 1024, 256 up to 4096, then every 512. A list, so
    only for a bounded `max_tokens` (prefill_graph_sizes counts any)."""
    first, step = PREFILL_GRAPH_TAIL
    return _stepped_counts(max_tokens) + list(range(first, max_tokens + 1, step))


def prefill_graph_sizes(max_tokens: int) -> int:
    """How many token counts SGLang captures prefill graphs for, up to `max_tokens`, counted
    without listing them (a chunk size may be as large as the settings allow)."""
    first, step = PREFILL_GRAPH_TAIL
    return len(_stepped_counts(max_tokens)) + max(0, (max_tokens - first) // step + 1)


def _stepped_counts(max_tokens: int) -> list[int]:
    """The counts below 4608 (at most 49 of them)."""
    return [n for first, last, step in PREFILL_GRAPH_STEPS
            for n in range(first, min(last, max_tokens) + 1, step)]


def deepep_prefill_graph_sizes() -> int:
    """With DeepEP, SGLang fixes the prefill graphs before its memory rule runs: the counts up
    to its documented default of 2048 tokens, each rounded up to a multiple of 8 (DeepEP's
    all-to-all hangs on others), duplicates dropped (cuda_graph_hook.apply_deepep_adjustments);
    the chunk and max_total_tokens no longer move them."""
    return len({-(-n // 8) * 8 for n in prefill_graph_token_counts(DEEPEP_PREFILL_GRAPH_TOKENS)})


def prefill_graphs_captured(settings: SGLangSettings, *, deepseek_v4: bool = False) -> bool:
    """SGLang captures prefill graphs (breakable, its CUDA default) unless they are disabled,
    or one of cuda_graph_hook's breakable-graph blockers holds: decode context parallelism
    (its capture has no DCP metadata), DeepSeek-V4 (its c4 indexer scratch would be pinned
    in the capture pool; V4's prefill context parallelism, which lifts that, is not planned),
    a multimodal model SGLang has not validated prefill graphs for (served/multimodal.py), or
    pipeline stages (modes/pipeline_stages.py)."""
    return (not settings.disable_prefill_cuda_graph and settings.dcp_size == 1
            and not deepseek_v4 and prefill_graphs_allowed(settings)
            and prefill_graphs_by_default(settings))


def graph_reserve_mib(
    decode_max_bs: int, prefill_sizes: int, mla: bool, *, decode_graphs: bool, prefill_graphs: bool
) -> float:
    """MiB kept for CUDA graphs: 2 per decode batch slot, and for prefill graphs 8 per captured
    size (MLA: a flat 1536, its backends' workspace)."""
    reserve = 0.0
    if decode_graphs:
        reserve += decode_max_bs * DECODE_GRAPH_MIB_PER_BATCH
    if prefill_graphs:
        reserve += MLA_PREFILL_GRAPH_MIB if mla else prefill_sizes * PREFILL_GRAPH_MIB_PER_SIZE
    return reserve


def reserved_mib(
    gpu_mib: float, chunked_prefill_size: int, tp_size: int, pp_size: int, graphs_mib: float
) -> float | int:
    """MiB SGLang keeps out of the static fraction: metadata, activations of one chunk, the
    parallel groups' slack and the graphs; at least 10 GiB on a GPU above 60 GiB."""
    reserve: float | int = CONSTANT_RESERVE_MIB
    reserve += max(chunked_prefill_size, MIN_ACTIVATION_TOKENS) * ACTIVATION_MIB_PER_TOKEN
    reserve += tp_size * pp_size / 8 * PARALLEL_RESERVE_MIB_PER_8_RANKS
    reserve += graphs_mib
    if gpu_mib > LARGE_GPU_MIB:
        reserve = max(reserve, LARGE_GPU_MIN_RESERVE_MIB)
    return reserve


def fraction_left(gpu_mib: float, reserve_mib: float | int) -> float:
    """(total - reserved) / total, rounded to three decimals (Python's round, as SGLang)."""
    return round((gpu_mib - reserve_mib) / gpu_mib, FRACTION_DECIMALS)


def default_mem_fraction_static(
    settings: SGLangSettings, *, mla: bool, pp_size: int | None = None,
    deepseek_v4: bool = False
) -> float:
    """SGLang's mem_fraction_static for `settings` on a GPU of `settings.gpu_memory_bytes`:
    the given `--chunked-prefill-size`, `--tp-size`, `--max-running-requests`,
    `--max-total-tokens` and graph switches, SGLang's defaults for the rest. `mla`: the model's
    attention is MLA (DeepSeek, DSA models); `deepseek_v4`: SGLang's DeepSeek-V4 path, which
    captures no prefill graphs. A GPU too small for SGLang's reserve is refused."""
    total = settings.gpu_memory_bytes
    if total is None:
        raise PlanError(
            "engine.gpu_memory_bytes: SGLang's default mem_fraction_static needs the GPU's total "
            "memory; expected a byte count, got null",
            field="engine.gpu_memory_bytes",
        )
    gpu_mib = gpu_memory_mib(total)
    chunked = settings.chunked_prefill_size
    if chunked is None:
        chunked = default_chunked_prefill_size(gpu_mib)
    decode_bs = decode_graph_max_bs(gpu_mib, settings.tp_size, settings.max_running_requests)
    sizes = (deepep_prefill_graph_sizes() if settings.moe_a2a_backend == "deepep" else
             prefill_graph_sizes(prefill_graph_max_tokens(chunked, mla, settings.max_total_tokens)))
    prefill = prefill_graphs_captured(settings, deepseek_v4=deepseek_v4)
    graphs = graph_reserve_mib(
        decode_bs, sizes, mla,
        decode_graphs=not settings.disable_decode_cuda_graph, prefill_graphs=prefill,
    )
    graphs += dp_attention_graph_mib(settings, decode_bs)
    graphs += deepep_prefill_graph_mib(settings, prefill_graphs=prefill)
    stages = settings.pp_size if pp_size is None else pp_size
    reserve = reserved_mib(gpu_mib, chunked, settings.tp_size, stages, graphs)
    reserve += deepep_a2a_mib(settings)
    if gpu_mib <= reserve:
        raise PlanError(
            f"engine.gpu_memory_bytes: SGLang's default mem_fraction_static keeps {reserve:g} MiB "
            f"back for activations and CUDA graphs; expected a GPU of more than that, got "
            f"{gpu_mib:g} MiB (give mem_fraction_static, or a smaller chunked_prefill_size)",
            field="engine.gpu_memory_bytes",
        )
    fraction = fraction_left(gpu_mib, reserve)
    if fraction <= 0:
        raise PlanError(
            f"engine.gpu_memory_bytes: SGLang's default mem_fraction_static rounds to {fraction} "
            f"on {gpu_mib:g} MiB with {reserve:g} MiB kept back; expected a positive fraction "
            "(give mem_fraction_static)",
            field="engine.gpu_memory_bytes",
        )
    return multimodal_fraction(fraction, settings)
