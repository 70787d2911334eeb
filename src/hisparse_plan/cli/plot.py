"""Drawing a capacity sweep and a deployment comparison (matplotlib, from the `plot`
extra)."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

from hisparse_plan.cli.errors import CommandError
from hisparse_plan.models.base import GIB
from hisparse_plan.operator import Sweep, SweepPoint
from hisparse_plan.operator.deployments import DeploymentComparison, DeploymentResult

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def plot_sweep(result: Sweep, path: str, *, title: str) -> None:
    """Write the sweep's concurrencies against the swept value as an image (PNG by default)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import ScalarFormatter
    except ImportError:
        raise CommandError(
            "--plot needs matplotlib: pip install 'hisparse-plan[plot]'"
        ) from None
    planned = [p for p in result.points if p.comparison is not None or p.regular is not None]
    if not planned:
        raise CommandError("--plot: the planner refused every sweep point, nothing to draw")
    by_tokens = result.axis == "max-model-len"
    xs = [point.value if by_tokens else point.value / GIB for point in planned]
    series = _series(planned)
    # The Figure API, not pyplot: no global state, no GUI backend, safe in any process.
    figure = Figure(figsize=(7.0, 4.0), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for (label, ys), style in zip(series.items(), ("o-", "s--", "^:"), strict=False):
        axes.plot(xs, ys, style, label=label)
    axes.set_xscale("log", base=2)
    # Labels at the swept points; tilted, since the last one may sit close to a power of two.
    axes.set_xticks(xs, [_tick(x, by_tokens) for x in xs], rotation=30)
    axes.minorticks_off()
    if by_tokens:  # concurrency falls roughly as 1 / context: a log axis keeps both ends legible
        axes.set_yscale("log", base=2)
        axes.yaxis.set_major_formatter(ScalarFormatter())
    axes.set_xlabel("max_model_len (tokens)" if by_tokens else "host pool (GiB)")
    axes.set_ylabel("concurrent requests")
    axes.set_title("\n".join(textwrap.wrap(title, 100)), fontsize=9)
    axes.grid(True, which="both", alpha=0.3)
    axes.legend()
    suffix = Path(path).suffix.lower().lstrip(".") or "png"
    try:
        figure.savefig(path, format=suffix)
    except ValueError as error:  # an image format matplotlib does not write
        raise CommandError(f"--plot {path}: {error}") from None


def _series(planned: list[SweepPoint]) -> dict[str, list[float]]:
    """The curves to draw: HiSparse's two and its baseline, or a regular model's one."""
    if all(p.regular is not None for p in planned):
        return {"all on the GPU (no HiSparse)": [
            p.regular.max_concurrency for p in planned if p.regular]}
    return {
        "HiSparse max": [p.comparison.hisparse.max_concurrency for p in planned if p.comparison],
        "HiSparse steady state": [
            p.comparison.hisparse.steady_state_concurrency or 0.0
            for p in planned if p.comparison
        ],
        "all-GPU baseline": [
            p.comparison.baseline.max_concurrency for p in planned if p.comparison
        ],
    }


def _tick(value: float, by_tokens: bool) -> str:
    if by_tokens:
        tokens = int(value)
        return f"{tokens // 1024}k" if tokens % 1024 == 0 else str(tokens)
    return f"{value:g}"


def _figure(width: float, height: float) -> Figure:
    """A Figure with its Agg canvas (the Figure API, not pyplot: no global state)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise CommandError("--plot needs matplotlib: pip install 'hisparse-plan[plot]'") from None
    figure = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _save(figure: Figure, path: str, flag: str) -> None:
    suffix = Path(path).suffix.lower().lstrip(".") or "png"
    try:
        figure.savefig(path, format=suffix)
    except ValueError as error:  # an image format matplotlib does not write
        raise CommandError(f"{flag} {path}: {error}") from None


GIVEN = "KV memory per GPU given"
"""The panel of deployments whose KV memory was given (--gpu-mem), not derived from a GPU."""


def _variant(result: DeploymentResult) -> str:
    """The cache variant by what was asked (a refused deployment resolved nothing)."""
    d = result.deployment
    return d.kv_cache_dtype if not d.hisparse else f"{d.kv_cache_dtype} + HiSparse"


def _variant_labels(comparison: DeploymentComparison) -> dict[str, str]:
    """Each variant with the dtype it was planned in: `fp8 (fp8_ds_mla) + HiSparse`."""
    labels: dict[str, str] = {}
    for result in comparison.results:
        d = result.deployment
        variant = _variant(result)
        if result.kv_dtype is not None and result.kv_dtype != d.kv_cache_dtype:
            labels[variant] = variant.replace(d.kv_cache_dtype, f"{d.kv_cache_dtype} "
                                              f"({result.kv_dtype})", 1)
        labels.setdefault(variant, variant)
    return labels


def plot_deployments(comparison: DeploymentComparison, path: str) -> None:
    """Node concurrency of every deployment: one panel per GPU, the tp x dp splits along x,
    one bar per cache variant (KV dtype, HiSparse); a refused deployment is an x at 0."""
    planned = [r for r in comparison.results if r.refusal is None]
    if not planned:
        raise CommandError("--plot: every deployment was refused, nothing to draw")
    gpus = list(dict.fromkeys(r.deployment.gpu or GIVEN for r in comparison.results))
    splits = list(dict.fromkeys(_split(r) for r in comparison.results))
    variants = list(dict.fromkeys(_variant(r) for r in comparison.results))
    figure = _figure(max(6.0, 3.2 * len(gpus)), 4.2)
    panels = figure.subplots(1, len(gpus), sharey=True, squeeze=False)[0]
    width = 0.8 / len(variants)
    colors = [f"C{i}" for i in range(len(variants))]
    for panel, gpu in zip(panels, gpus, strict=True):
        for v, variant in enumerate(variants):
            for s, split in enumerate(splits):
                found = [r for r in comparison.results if (r.deployment.gpu or GIVEN) == gpu
                         and _split(r) == split and _variant(r) == variant]
                if not found:
                    continue
                x = s + (v - (len(variants) - 1) / 2) * width
                value = found[0].node_concurrency
                if value is None:
                    panel.plot([x], [0], marker="x", color=colors[v], markersize=7)
                else:
                    panel.bar([x], [value], width=width * 0.95, color=colors[v])
        panel.set_xticks(range(len(splits)), splits)
        panel.set_title(gpu, fontsize=10)
        panel.grid(True, axis="y", alpha=0.3)
    panels[0].set_ylabel("concurrent max_model_len requests per node")
    from matplotlib.patches import Patch

    labels = _variant_labels(comparison)
    handles = [Patch(color=color, label=labels[variant])
               for variant, color in zip(variants, colors, strict=True)]
    figure.legend(handles=handles, loc="outside lower center", ncol=min(4, len(handles)),
                  fontsize=8)
    cap = "" if comparison.max_num_seqs is None else f", at most {comparison.max_num_seqs} a rank"
    figure.suptitle(f"{comparison.model}: node concurrency by deployment (x = refused{cap})",
                    fontsize=10)
    _save(figure, path, "--plot")


def _split(result: DeploymentResult) -> str:
    d = result.deployment
    return f"tp{d.tp} dp{d.dp}" + (f" pp{d.pp}" if d.pp > 1 else "")


def _preferred(result: DeploymentResult) -> tuple[bool, bool]:
    return (result.refusal is None, result.deployment.hisparse)


MEMORY_PARTS = (
    ("weights", "weights", "C0"),
    ("activation reserve", "activation_reserve", "C1"),
    ("KV cache pool", "kv_cache_pool", "C2"),
    ("KV left over / held back", "held_back", "C7"),
)


def plot_memory(comparison: DeploymentComparison, path: str) -> None:
    """Where one GPU's memory goes in each deployment (stacked GiB: weights, activation
    reserve, KV-cache pool, the rest held back), and beside it each GPU's share of the HiSparse
    host pool (the pool of a DP rank over its TP ranks)."""
    # One bar per GPU and split: a planned variant before a refused one, HiSparse first (its
    # host pool is drawn beside).
    best: dict[str, DeploymentResult] = {}
    for result in comparison.results:
        key = f"{result.deployment.gpu} {_split(result)}"
        held = best.get(key)
        if result.memory is not None and (held is None or _preferred(result) > _preferred(held)):
            best[key] = result
    shown = {
        key + (" (refused)" if result.refusal is not None else ""): result
        for key, result in best.items()
    }
    if not shown:
        raise CommandError("--plot-memory: no deployment has a GPU's memory to draw (give GPUs, "
                           "not --gpu-mem, and a model whose weights fit)")
    hosts = {key: r.host_pool_bytes / r.deployment.tp / GIB for key, r in shown.items()
             if r.host_pool_bytes is not None}
    figure = _figure(max(7.0, 0.7 * len(shown) + 3.0), 4.6)
    if hosts:
        gpu_panel, host_panel = figure.subplots(
            1, 2, gridspec_kw={"width_ratios": [max(3, len(shown)), max(1, len(hosts))]}
        )
    else:
        gpu_panel, host_panel = figure.subplots(1, 1), None
    keys = list(shown)
    bottoms = [0.0] * len(keys)
    for label, field, color in MEMORY_PARTS:
        heights = []
        for key in keys:
            memory = shown[key].memory
            if memory is None:  # filtered above; keeps the types exact
                heights.append(0.0)
                continue
            value = getattr(memory, field)
            if field == "held_back":
                value += memory.kv_cache_left_over
            heights.append(value / GIB)
        gpu_panel.bar(keys, heights, bottom=bottoms, color=color, label=label)
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    gpu_panel.set_ylabel("GiB of one GPU")
    gpu_panel.set_title("GPU memory per rank", fontsize=10)
    gpu_panel.tick_params(axis="x", labelrotation=45, labelsize=8)
    gpu_panel.grid(True, axis="y", alpha=0.3)
    gpu_panel.legend(fontsize=8, loc="upper left")
    if host_panel is not None:
        host_panel.bar(list(hosts), list(hosts.values()), color="C4", label="host pool")
        host_panel.set_ylabel("GiB of host DRAM per GPU")
        host_panel.set_title("HiSparse host pool per GPU", fontsize=10)
        host_panel.tick_params(axis="x", labelrotation=45, labelsize=8)
        host_panel.grid(True, axis="y", alpha=0.3)
    figure.suptitle(f"{comparison.model}: where each GPU's memory goes", fontsize=10)
    _save(figure, path, "--plot-memory")
