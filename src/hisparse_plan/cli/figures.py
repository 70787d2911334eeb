"""One engine's pools for a model on one rank, in figures both engines share, and the engines'
figures side by side (`capacity --engine vllm,sglang`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hisparse_plan.cli.render import Column, Renderer, concurrency
from hisparse_plan.cli.sizes import format_size


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


def node_rows(dp: int, figures: Sequence[Figures]) -> list[list[str]]:
    """The deployment's totals over its `dp` DP ranks (every GPU and host pool counted), for
    the engines whose figures count them; "-" for the others."""

    def cell(value: int | float | None, size: bool) -> str:
        if value is None:
            return "-"
        return format_size(int(value)) if size else concurrency(float(value))

    return [
        [f"node: max concurrent ({dp} DP ranks)",
         *(cell(f.node_concurrency, False) for f in figures)],
        ["node: device pools (every GPU)", *(cell(f.node_device_bytes, True) for f in figures)],
        ["node: host pools", *(cell(f.node_host_bytes, True) for f in figures)],
    ]


def _beside_host_row(figures: Sequence[Figures]) -> list[list[str]]:
    """Host memory beside the host pool, where an engine plans some (SGLang's HiSparse)."""
    if all(f.beside_pools_host_bytes is None for f in figures):
        return []
    return [["beside the host pool", *("-" if f.beside_pools_host_bytes is None
                                       else format_size(f.beside_pools_host_bytes)
                                       for f in figures)]]


def render_engines(out: Renderer, heading: str, figures: Sequence[Figures],
                   columns: Sequence[str]) -> None:
    """One column per engine (headed `columns`, in the order of `figures`), one row per
    figure."""
    out.heading(heading)
    def row(label: str, cells: Sequence[str]) -> list[str]:
        return [label, *cells]

    def slots(f: Figures) -> str:
        return "not capped" if f.request_slots is None else str(f.request_slots)

    rows = [
        row("kv cache dtype", [f.kv_dtype for f in figures]),
        row("page / block tokens", [str(f.page_tokens) for f in figures]),
        row("tokens in the device pools", [str(f.device_tokens) for f in figures]),
        row("bytes per token", [f"{f.bytes_per_token:g}" for f in figures]),
        row("device pools", [format_size(f.device_bytes) for f in figures]),
        row("KV budget", [format_size(f.budget_bytes) for f in figures]),
        row("beside the budget", ["-" if f.beside_pools_bytes is None
                                  else format_size(f.beside_pools_bytes) for f in figures]),
        row("context length", [str(f.context_length) for f in figures]),
        row("max concurrent requests", [concurrency(f.max_concurrency) for f in figures]),
        row("steady state (HiSparse)",
            [concurrency(f.steady_state_concurrency) for f in figures]),
        row("request slots", [slots(f) for f in figures]),
        row("host pool", ["-" if f.host_bytes is None else format_size(f.host_bytes)
                          for f in figures]),
        *_beside_host_row(figures),
    ]
    dp = max(f.dp for f in figures)
    if dp > 1:
        rows += node_rows(dp, figures)
    out.table([Column(""), *(Column(name, "right") for name in columns)], rows)
