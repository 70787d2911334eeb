"""GPUs by name, and where one rank's HBM goes in a deployment.

HBM per GPU is the total the vendor's tool reports on a real card (nvidia-smi
`memory.total`, rocm-smi `VRAM Total Memory`), not the marketing figure: "141 GB" H200s
report 143771 MiB. CUDA's own `cudaMemGetInfo` total, which vLLM multiplies by
`gpu_memory_utilization`, can be a few hundred MiB lower (driver reservations); the
activation reserve below absorbs that.

One rank's HBM, in bytes, adds up exactly:

    hbm = held back + weights + activation reserve + KV cache

- held back: `hbm - ceil(hbm * gpu_memory_utilization)` (vLLM's budget is the ceiling);
- weights: the model's weight bytes (a checkpoint's safetensors total, or
  `parameters * bits_per_parameter / 8`) split evenly over the `tp * pp` ranks, rounded up (an
  estimate: embeddings and norms are in truth replicated or uneven);
- activation reserve: what vLLM finds by profiling a forward pass (activations, CUDA graphs,
  NCCL buffers, the CUDA context); estimated here as a flat `DEFAULT_ACTIVATION_RESERVE`,
  overridable;
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

MIB: Final = 2**20
DEFAULT_UTILIZATION: Final = "0.9"
"""vLLM's default gpu_memory_utilization."""
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
    GPU("h100", "NVIDIA H100 80GB HBM3 (SXM)", 81559 * MIB,
        "nvidia-smi memory.total 81559MiB (\"NVIDIA H100 80GB HBM3\")", ("h100-sxm", "h100-80gb"),
        (9, 0)),
    GPU("h200", "NVIDIA H200 141GB HBM3e", 143771 * MIB,
        "nvidia-smi memory.total 143771MiB (H200, marketed as 141 GB)", ("h200-sxm", "h200-nvl"),
        (9, 0)),
    GPU("b200", "NVIDIA B200 HBM3e", 183359 * MIB,
        "nvidia-smi memory.total 183359MiB (\"NVIDIA B200\", marketed as 180/192 GB)", (),
        (10, 0)),
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
    """Ranks of one pipeline stage (each stage's ranks keep equal pools)."""

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
    gpu_memory_utilization: str = DEFAULT_UTILIZATION,
    activation_reserve: int = DEFAULT_ACTIVATION_RESERVE,
) -> MemoryBreakdown:
    """One rank's HBM split into the four parts; refused when nothing is left for the cache.
    `weights`: a parameter count and its bits, or the model's weight bytes outright."""
    share = utilization(gpu_memory_utilization)
    budget = math.ceil(gpu.hbm_bytes * share)
    ranks = tp * pp
    total = weights if isinstance(weights, int) else weight_bytes(weights)
    per_rank = -(-total // ranks)
    kv_cache = budget - per_rank - activation_reserve
    if kv_cache <= 0:
        raise ConfigError(
            f"gpu: {gpu.title} x {ranks} ranks leaves no KV cache: expected weights "
            f"({per_rank} B a rank) + activation reserve ({activation_reserve} B) below "
            f"{budget} B (HBM {gpu.hbm_bytes} B x {gpu_memory_utilization}), got "
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
    )
