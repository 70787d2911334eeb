"""The human view of an SGLang plan."""

from __future__ import annotations

from collections.abc import Sequence

from hisparse_plan.cli.render import Column, Renderer, concurrency
from hisparse_plan.cli.sglang.figures import (
    sglang_device_bytes,
    sglang_host_bytes,
    sglang_request_table_bytes,
)
from hisparse_plan.cli.sizes import format_size
from hisparse_plan.models.sglang_plan import SGLangPlan
from hisparse_plan.targets.sglang.hisparse.meta import metadata_bytes


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
