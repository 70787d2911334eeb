"""The `plan` summary of a regular plan (no HiSparse): groups, one device pool per pipeline
stage, what one max_model_len request takes, and the concurrency. There is no host pool."""

from __future__ import annotations

from hisparse_plan.cli.render import Column, Renderer, concurrency
from hisparse_plan.cli.sizes import format_size
from hisparse_plan.models import KVCacheGroup, KVCachePlan, UniformTypeSpec
from hisparse_plan.targets.vllm.rules.required import required_blocks


def group_label(group: KVCacheGroup) -> str:
    """The group's kind; a uniform_type group names its members' kinds."""
    spec = group.spec
    if isinstance(spec, UniformTypeSpec):
        kinds = dict.fromkeys(member.kind for member in spec.specs.values())
        return "+".join(kinds)
    return spec.kind


def required_per_group(plan: KVCachePlan) -> list[int]:
    return [
        required_blocks(group.spec, plan.max_model_len, plan.workload) for group in plan.groups
    ]


def group_rows(plan: KVCachePlan, labels: list[str], needs: list[int]) -> list[list[str]]:
    """Runs of alike groups (same label, page and blocks per request) on one row each: index
    span, label, layers per group, page, blocks one request takes."""
    runs: list[tuple[tuple[str, int, int], list[int]]] = []
    for index, (group, label, need) in enumerate(zip(plan.groups, labels, needs, strict=True)):
        key = (label, group.spec.page_size_bytes, need)
        if runs and runs[-1][0] == key:
            runs[-1][1].append(index)
        else:
            runs.append((key, [index]))
    rows = []
    for (label, page, need), members in runs:
        counts = [len(plan.groups[i].layer_names) for i in members]
        span = str(members[0]) if len(members) == 1 else f"{members[0]}-{members[-1]}"
        rows.append([
            span,
            label if len(members) == 1 else f"{label} x{len(members)}",
            "+".join(map(str, counts)),
            format_size(page),
            str(need),
        ])
    return rows


def describe(title: str, plan: KVCachePlan, kv_dtype: str | None = None) -> str:
    """One line: the model, its cache dtype when not the model's bfloat16, block sizes,
    context, layout and stages."""
    block_sizes = sorted({group.spec.block_size for group in plan.groups})
    parts = [
        "no HiSparse" if kv_dtype in (None, "bfloat16") else f"no HiSparse, {kv_dtype}",
        "block " + "/".join(map(str, block_sizes)),
        f"max_model_len {plan.max_model_len}",
        plan.device_pools[0].layout.value,
    ]
    if plan.fitted_max_model_len not in (None, plan.workload.max_model_len):
        parts[2] += f" (auto-fit from {plan.workload.max_model_len})"
    elif plan.fitted_max_model_len is not None:
        parts[2] += " (auto-fit: all of it fits)"
    if len(plan.device_pools) > 1:
        parts.append(f"pp {len(plan.device_pools)}")
    return f"{title}: " + ", ".join(parts)


def render_regular_plan(
    out: Renderer, title: str, plan: KVCachePlan, kv_dtype: str | None = None
) -> None:
    out.heading(describe(title, plan, kv_dtype))
    out.table(
        [Column("#", "right"), Column("group"), Column("layers", "right"),
         Column("page", "right"), Column("blocks/request", "right")],
        group_rows(plan, [group_label(g) for g in plan.groups], required_per_group(plan)),
        title="groups",
    )
    staged = len(plan.device_pools) > 1
    every_layer = sum(len(group.layer_names) for group in plan.groups)
    pools = []
    for index, pool in enumerate(plan.device_pools):
        layers = len(pool.layers) if pool.layers is not None else every_layer
        pools.append([
            f"stage {index}" if staged else "device", str(layers), str(plan.num_blocks),
            str(pool.bytes_per_block), format_size(pool.size),
            f"{format_size(pool.available_bytes)} available",
        ])
    out.table(
        [Column("pool"), Column("layers", "right"), Column("blocks", "right"),
         Column("bytes/block", "right"), Column("size", "right"), Column("of")],
        pools,
        title="pools (no host pool: every group on the GPU)",
    )
    if plan.kv_sharing:
        targets = sorted(set(plan.kv_sharing.values()))
        out.line(f"and {len(plan.kv_sharing)} layers that keep no pages: each reads the cache "
                 f"of {' or '.join(targets)} (kv_sharing)")
        out.line()
    need = sum(required_per_group(plan))
    out.table(
        [Column("pool"), Column("blocks", "right"), Column("bytes", "right")],
        [
            [f"stage {index}" if staged else "device", str(need),
             format_size(need * pool.bytes_per_block)]
            for index, pool in enumerate(plan.device_pools)
        ],
        title=f"per request ({plan.max_model_len} tokens)",
    )
    out.pairs(
        [("concurrency", concurrency(plan.capacity.max_concurrency)),
         ("", f"{plan.num_blocks} blocks / {need} blocks per request")],
        title="capacity (concurrent max_model_len requests)",
    )
