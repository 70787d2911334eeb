"""GPUs by name, and where one rank's HBM goes in a deployment.

HBM per GPU is the total the vendor's tool reports on a real card (nvidia-smi
`memory.total`, rocm-smi `VRAM Total Memory`), not the marketing figure: "141 GB" H200s
report 143771 MiB. CUDA's own `cudaMemGetInfo` total, which vLLM multiplies by
`gpu_memory_utilization`, can be a few hundred MiB lower (driver reservations); the
activation reserve below absorbs that.

One rank's HBM, in bytes, adds up exactly:

    hbm = held back + weights + activation reserve + KV cache

- held back: `hbm - ceil(hbm * gpu_memory_utilization)` (vLLM's budget is the ceiling); an
  unset gpu_memory_utilization is what the chosen vLLM resolves it to (`memory_sizing`);
- weights: the model's weight bytes (a checkpoint's safetensors total, or
  `parameters * bits_per_parameter / 8`) split evenly over the `tp * pp` ranks, rounded up (an
  estimate: embeddings and norms are in truth replicated or uneven);
- activation reserve: what vLLM finds by profiling a forward pass (activations, CUDA graphs,
  NCCL buffers, the CUDA context), or, with vLLM 0.34's extensible KV cache, measures after
  warm-up and CUDA graph capture (plus its safety margin of at least 1 GiB); estimated here as
  a flat `DEFAULT_ACTIVATION_RESERVE`, overridable;
- KV cache: the rest. The planner then places a whole number of blocks in it; the part under
  one block stays unused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Final

from hisparse_plan.models.base import GIB
from hisparse_plan.presets.catalog import Weights
from hisparse_plan.presets.errors import ConfigError
from hisparse_plan.presets.settings import DEFAULT_VLLM, VllmVersion

MIB: Final = 2**20
ESTIMATED_UTILIZATION: Final = "0.92"
"""vLLM's `CacheConfig.DEFAULT_GPU_MEMORY_UTILIZATION` where the KV cache is sized from a
profiling estimate: 0.33 always (its field default), 0.34 without the extensible KV cache."""
MEASURED_UTILIZATION: Final = "1.0"
"""vLLM 0.34's unset gpu_memory_utilization with the extensible KV cache, which measures the
memory vLLM itself uses and so needs no headroom (`resolved_gpu_memory_utilization`)."""
EXTENSIBLE_FROM: Final[frozenset[VllmVersion]] = frozenset({"0.34"})
"""vLLM releases with the extensible KV cache (0.33's CacheConfig has no such field)."""
DEFAULT_ACTIVATION_RESERVE: Final = 4 * GIB


@dataclass(frozen=True, slots=True)
class GPU:
    name: str
    title: str
    hbm_bytes: int
    source: str
    aliases: tuple[str, ...] = ()
    compute_capability: tuple[int, int] | None = None
    """CUDA's (major, minor) for the GPU (SGLang's defaults follow it); None: not CUDA."""


GPUS: Final[tuple[GPU, ...]] = (
    GPU("a100-80gb", "NVIDIA A100 80GB", 81920 * MIB,
        "nvidia-smi memory.total 81920MiB (A100/A800 80GB)", ("a100",), (8, 0)),
    GPU("l40s", "NVIDIA L40S", 46068 * MIB,
        "nvidia-smi memory.total 46068MiB (\"NVIDIA L40S\", 48 GB GDDR6; not re-measured here)",
        (), (8, 9)),
    GPU("h100", "NVIDIA H100 80GB HBM3 (SXM)", 81559 * MIB,
        "nvidia-smi memory.total 81559MiB (\"NVIDIA H100 80GB HBM3\")", ("h100-sxm", "h100-80gb"),
        (9, 0)),
    GPU("h200", "NVIDIA H200 141GB HBM3e", 143771 * MIB,
        "nvidia-smi memory.total 143771MiB (H200, marketed as 141 GB)", ("h200-sxm", "h200-nvl"),
        (9, 0)),
    GPU("b200", "NVIDIA B200 HBM3e", 183359 * MIB,
        "nvidia-smi memory.total 183359MiB (\"NVIDIA B200\", marketed as 180/192 GB)", (),
        (10, 0)),
    GPU("gb200", "NVIDIA GB200 (one Blackwell GPU of a Grace Blackwell superchip)", 189471 * MIB,
        "nvidia-smi memory.total 189471MiB (\"NVIDIA GB200\", 186 GB HBM3e; not re-measured "
        "here)", (), (10, 0)),
    GPU("rtx-pro-6000", "NVIDIA RTX PRO 6000 Blackwell", 97887 * MIB,
        "nvidia-smi memory.total 97887MiB (\"NVIDIA RTX PRO 6000 Blackwell\", 96 GB GDDR7; not "
        "re-measured here)", ("rtx-pro-6000-blackwell",), (12, 0)),
    GPU("mi300x", "AMD Instinct MI300X", 205822885888,
        "rocm-smi VRAM Total Memory 205822885888 B (192 GiB)", ("mi300",)),
)


def gpu_names() -> list[str]:
    return [gpu.name for gpu in GPUS]


def find_gpu(name: str) -> GPU:
    wanted = name.strip().lower().replace("_", "-")
    for gpu in GPUS:
        if wanted == gpu.name or wanted in gpu.aliases:
            return gpu
    raise ConfigError(
        f"unknown GPU {name!r}; expected one of {', '.join(gpu_names())}", field="gpu"
    )


def utilization(text: str) -> Fraction:
    """A gpu_memory_utilization in (0, 1], exactly as written (no float rounding)."""
    try:
        value = Fraction(text)
    except (ValueError, ZeroDivisionError):
        raise ConfigError(
            f"gpu_memory_utilization: expected a number in (0, 1], got {text!r}",
            field="gpu_memory_utilization",
        ) from None
    if not 0 < value <= 1:
        raise ConfigError(
            f"gpu_memory_utilization: expected a number in (0, 1], got {text}",
            field="gpu_memory_utilization",
        )
    return value


@dataclass(frozen=True, slots=True)
class MemorySizing:
    """How the chosen vLLM sizes one rank's KV cache: by a profiling estimate or, with 0.34's
    extensible KV cache, from the memory it measures after warm-up; and the share of the GPU
    it takes, given or that mode's default."""

    vllm: VllmVersion
    extensible: bool
    utilization: str
    given: bool
    """The operator set gpu_memory_utilization (else the mode's default)."""

    @property
    def words(self) -> str:
        """The assumption, in a few words for a heading."""
        mode = "extensible KV cache" if self.extensible else "profiled KV cache"
        if self.given:
            return f"gpu_memory_utilization {self.utilization} (given, vLLM {self.vllm} {mode})"
        return f"gpu_memory_utilization {self.utilization} (vLLM {self.vllm}'s default, {mode})"

    @property
    def explained(self) -> str:
        """What the mode measures and what it leaves out, for a note under the figures."""
        if self.extensible:
            return (
                f"vLLM {self.vllm}'s extensible KV cache takes what is left after warm-up and "
                "CUDA graph capture, as measured (here: weights + activation reserve), less a "
                "margin of at least 1 GiB; it cannot see other processes on the GPU, "
                "weight-transfer buffers or a KV connector's own buffers (keep room for them "
                "with --gpu-memory-utilization below 1)"
            )
        return (
            f"vLLM {self.vllm} sizes the KV cache from a profiling run: gpu_memory_utilization "
            "of the GPU less the weights and the profiled peak (here: the activation "
            "reserve); what it does not profile must fit in the memory held back"
        )


def memory_sizing(
    vllm: VllmVersion = DEFAULT_VLLM,
    *,
    gpu_memory_utilization: str | None = None,
    extensible: bool | None = None,
    kv_cache_memory_given: bool = False,
    num_blocks_override_given: bool = False,
) -> MemorySizing:
    """The sizing mode and share as vLLM resolves them (0.34: `VllmConfig.
    _resolve_extensible_kv_cache`, then `CacheConfig.resolved_gpu_memory_utilization`; the GPUs
    here are CUDA or ROCm, where the extensible KV cache is on unless something overrides the
    measured size). `extensible` None: vLLM's choice; True where it cannot be is refused."""
    unsupported = None
    if vllm not in EXTENSIBLE_FROM:
        unsupported = f"vLLM {vllm} has no extensible KV cache (0.34 added it)"
    elif kv_cache_memory_given:
        unsupported = ("it sizes the KV cache from measured memory, which "
                       "kv_cache_memory_bytes overrides")
    elif num_blocks_override_given:
        unsupported = ("it sizes the KV cache from measured memory, which "
                       "num_gpu_blocks_override overrides")
    if extensible and unsupported is not None:
        raise ConfigError(
            f"enable_extensible_kv_cache: expected it off here, got on: {unsupported}",
            field="enable_extensible_kv_cache",
        )
    measured = unsupported is None if extensible is None else extensible
    default = MEASURED_UTILIZATION if measured else ESTIMATED_UTILIZATION
    if gpu_memory_utilization is not None:
        utilization(gpu_memory_utilization)  # refused here, before any plan, when out of range
    return MemorySizing(
        vllm=vllm,
        extensible=measured,
        utilization=gpu_memory_utilization or default,
        given=gpu_memory_utilization is not None,
    )


DEFAULT_SIZING: Final = memory_sizing()
"""The default vLLM's own choice on a CUDA GPU."""
DEFAULT_UTILIZATION: Final = DEFAULT_SIZING.utilization
"""The default vLLM's gpu_memory_utilization on a CUDA GPU (0.34 with the extensible KV
cache: 1.0)."""


def weight_bytes(weights: Weights) -> int:
    """All the model's weights, in bytes (rounded up)."""
    return math.ceil(weights.parameters * Fraction(weights.bits_per_parameter) / 8)


@dataclass(frozen=True, slots=True)
class MemoryBreakdown:
    """Where one rank's HBM goes; the parts add up to `hbm` exactly."""

    gpu: GPU
    utilization: Fraction
    ranks: int
    """tp * pp: the ranks the weights are split over."""
    held_back: int
    weights: int
    activation_reserve: int
    kv_cache: int
    model_weights: int = 0
    """The whole model's weight bytes, all ranks together."""
    tp: int = 1
    """Ranks of one pipeline stage that split the weights (tp, or tp x dp with expert
    parallelism)."""
    sizing: MemorySizing = DEFAULT_SIZING
    """The vLLM sizing mode the utilization came from."""

    @property
    def hbm(self) -> int:
        return self.gpu.hbm_bytes

    @property
    def parts(self) -> tuple[tuple[str, int], ...]:
        return (
            (f"held back (1 - gpu_memory_utilization {float(self.utilization):g})",
             self.held_back),
            (f"weights (1/{self.ranks} of the model)", self.weights),
            ("activation reserve", self.activation_reserve),
            ("KV cache", self.kv_cache),
        )


def memory_breakdown(
    gpu: GPU,
    weights: Weights | int,
    *,
    tp: int = 1,
    pp: int = 1,
    gpu_memory_utilization: str | None = None,
    activation_reserve: int = DEFAULT_ACTIVATION_RESERVE,
    sizing: MemorySizing | None = None,
) -> MemoryBreakdown:
    """One rank's HBM split into the four parts; refused when nothing is left for the cache.
    `weights`: a parameter count and its bits, or the model's weight bytes outright. The share
    is `sizing`'s (`memory_sizing`); without it, the default vLLM's on a CUDA GPU, or
    `gpu_memory_utilization` when given."""
    if sizing is None:
        sizing = memory_sizing(gpu_memory_utilization=gpu_memory_utilization)
    elif gpu_memory_utilization is not None:
        raise ConfigError(
            "gpu_memory_utilization: expected it once, in sizing, got it beside sizing too",
            field="gpu_memory_utilization",
        )
    share = utilization(sizing.utilization)
    budget = math.ceil(gpu.hbm_bytes * share)
    ranks = tp * pp
    total = weights if isinstance(weights, int) else weight_bytes(weights)
    per_rank = -(-total // ranks)
    kv_cache = budget - per_rank - activation_reserve
    if kv_cache <= 0:
        raise ConfigError(
            f"gpu: {gpu.title} x {ranks} ranks leaves no KV cache: expected weights "
            f"({per_rank} B a rank) + activation reserve ({activation_reserve} B) below "
            f"{budget} B (HBM {gpu.hbm_bytes} B x {sizing.utilization}), got "
            f"{per_rank + activation_reserve} B; add ranks (--tp, --pp) or a larger GPU",
            field="gpu",
        )
    return MemoryBreakdown(
        gpu=gpu,
        utilization=share,
        ranks=ranks,
        held_back=gpu.hbm_bytes - budget,
        weights=per_rank,
        activation_reserve=activation_reserve,
        kv_cache=kv_cache,
        model_weights=total,
        tp=tp,
        sizing=sizing,
    )
