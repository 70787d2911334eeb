"""Drawing a capacity sweep (matplotlib, from the `plot` extra)."""

from __future__ import annotations

from pathlib import Path

from hisparse_plan.cli.errors import CommandError
from hisparse_plan.models.base import GIB
from hisparse_plan.operator import Sweep


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
    planned = [point for point in result.points if point.comparison is not None]
    if not planned:
        raise CommandError("--plot: the planner refused every sweep point, nothing to draw")
    by_tokens = result.axis == "max-model-len"
    xs = [point.value if by_tokens else point.value / GIB for point in planned]
    series = {
        "HiSparse max": [p.comparison.hisparse.max_concurrency for p in planned if p.comparison],
        "HiSparse steady state": [
            p.comparison.hisparse.steady_state_concurrency or 0.0
            for p in planned if p.comparison
        ],
        "all-GPU baseline": [
            p.comparison.baseline.max_concurrency for p in planned if p.comparison
        ],
    }
    # The Figure API, not pyplot: no global state, no GUI backend, safe in any process.
    figure = Figure(figsize=(7.0, 4.0), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for (label, ys), style in zip(series.items(), ("o-", "s--", "^:"), strict=True):
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
    axes.set_title(title, fontsize=9)
    axes.grid(True, which="both", alpha=0.3)
    axes.legend()
    suffix = Path(path).suffix.lower().lstrip(".") or "png"
    try:
        figure.savefig(path, format=suffix)
    except ValueError as error:  # an image format matplotlib does not write
        raise CommandError(f"--plot {path}: {error}") from None


def _tick(value: float, by_tokens: bool) -> str:
    if by_tokens:
        tokens = int(value)
        return f"{tokens // 1024}k" if tokens % 1024 == 0 else str(tokens)
    return f"{value:g}"
