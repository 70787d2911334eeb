"""The human view of an SGLang plan, and the engines' figures side by side."""

from __future__ import annotations

from collections.abc import Sequence

from hisparse_plan.cli.engines import (
    Figures,
    sglang_device_bytes,
    sglang_host_bytes,
    sglang_request_table_bytes,
)
from hisparse_plan.cli.render import Column, Renderer, concurrency
from hisparse_plan.cli.sizes import format_size
from hisparse_plan.models.sglang_plan import SGLangPlan
from hisparse_plan.targets.sglang.hisparse_meta import metadata_bytes


def _shape(values: Sequence[int]) -> str:
    return "[" + ", ".join(str(v) for v in values) + "]"


def render_sglang_plan(out: Renderer, title: str, plan: SGLangPlan) -> None:
    """Pools (tokens, bytes, allocations), each pool's buffers, the budget and capacity."""
    out.heading(title)
    tensors = {tensor.pool: tensor for tensor in plan.tensors}
    pools = []
    buffers = []
    for pool in plan.pools:
        tensor = tensors.get(pool.name)
        layers = len(tensor.layers) if tensor is not None else 1
        count = len(plan.allocation_layers(pool))
        tokens = (pool.num_blocks - pool.padding_blocks) * (pool.block_tokens or 1)
        pools.append([
            pool.name, pool.location, str(tokens), str(layers),
            f"{count} x {format_size(pool.size)}", format_size(pool.size * count),
        ])
        for view in tensor.views if tensor is not None else []:
            buffers.append([pool.name, view.name, view.dtype, _shape(view.shape),
                            _shape(view.strides), str(view.storage_offset)])
    out.table(
        [Column("pool"), Column("where"), Column("tokens", "right"), Column("layers", "right"),
         Column("allocations", "right"), Column("bytes", "right")],
        pools, title="pools (tokens handed out; the padding page or slot 0 comes on top)",
    )
    out.table(
        [Column("pool"), Column("buffer"), Column("dtype"), Column("shape"),
         Column("strides"), Column("offset", "right")],
        buffers, title="buffers (one per layer of a per-layer pool)",
    )
    budget = plan.budget
    fraction = budget.mem_fraction_static
    rows = [
        ("page_size", str(plan.page_size)),
        ("max_total_num_tokens", str(plan.max_total_num_tokens)),
        ("max_running_requests", str(plan.max_running_requests)),
        ("bytes per token (cell size)", f"{budget.cell_size_bytes:g}"),
        ("KV budget", f"{format_size(budget.available_bytes)} "
                      f"({budget.available_bytes} B" + (
                          f", mem_fraction_static {fraction:g})" if fraction is not None
                          else ")")),
        ("device pools", format_size(sglang_device_bytes(plan))),
        ("req_to_token", f"{plan.req_to_token.dtype} {_shape(plan.req_to_token.shape)}, "
                         f"{format_size(sglang_request_table_bytes(plan))} beside the budget"),
    ]
    hisparse = plan.hisparse
    if hisparse is not None:
        host = sglang_host_bytes(plan) or 0
        rows += [
            ("HiSparse host pool", f"{hisparse.host_tokens} tokens, {format_size(host)} "
                                   f"(host_to_device_ratio {hisparse.host_to_device_ratio})"),
            ("HiSparse hot rows", f"{hisparse.hot_rows_per_request} a request "
                                  f"(device_buffer_size {hisparse.device_buffer_size})"),
            *_hisparse_metadata_rows(plan),
        ]
    out.pairs(rows, title="budget")
    capacity = plan.capacity
    out.pairs([
        ("max", concurrency(capacity.max_concurrency)),
        ("steady state", concurrency(capacity.steady_state_concurrency)),
    ], title="capacity (concurrent context-length requests)")
    for warning in plan.warnings:
        out.line(f"note: {warning}")


def _hisparse_metadata_rows(plan: SGLangPlan) -> list[tuple[str, str]]:
    """HiSparse's coordinator, host-pool and allocator tables, beside the budget."""
    if plan.hisparse is None or not plan.hisparse.metadata:
        return []
    device, host = (metadata_bytes(plan.hisparse, where) for where in ("device", "host"))
    return [("HiSparse metadata", f"{format_size(device)} on the GPU ({device} B), "
                                  f"{format_size(host)} on the host ({host} B), beside the "
                                  f"budget ({len(plan.hisparse.metadata)} tensors)")]


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


def render_engines(out: Renderer, heading: str, figures: Sequence[Figures]) -> None:
    """One column per engine, one row per figure."""
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
    names = {"vllm": "vLLM", "sglang": "SGLang"}
    out.table([Column(""), *(Column(names[f.engine], "right") for f in figures)], rows)
