"""HiSparse on top of the regular grouping: source, indexer, resident and hot groups
(SPEC 5.2-5.6)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hisparse_plan.errors import PlanError, UnsupportedRequestError
from hisparse_plan.models import (
    HOT_SUFFIX,
    RESIDENT_SUFFIX,
    HisparseConfig,
    HisparseHotSpec,
    HisparseResidentSpec,
    MLASpec,
    PlanRequest,
)
from hisparse_plan.models.base import built_for
from hisparse_plan.rules.arith import ceil_div
from hisparse_plan.targets.trace import Trace
from hisparse_plan.targets.vllm.groups import (
    Layer,
    PlannedGroup,
    first_of_each_spec,
    single_spec_group,
    uniform_group,
)
from hisparse_plan.targets.vllm.regular_groups import regular_groups
from hisparse_plan.targets.vllm.rules.hot import HotBuffer, HotPack, hot_buffer, hot_packs


@dataclass(frozen=True, slots=True)
class HisparseGrouping:
    source: PlannedGroup
    device: list[PlannedGroup]
    """indexer, resident packs, hot packs, then the regular groups (SPEC 5.6)."""
    hot: HotBuffer
    block_size: int


def hisparse_groups(
    request: PlanRequest, hisparse: HisparseConfig, layers: list[Layer], trace: Trace
) -> HisparseGrouping:
    distinct = first_of_each_spec(layers)
    refuse_deferred(request, distinct)
    index_topk = request.model.index_topk
    if index_topk is None:
        raise PlanError(
            "model.index_topk: HiSparse sizes the hot buffer from the indexer's top-k; expected "
            "an integer >= 1, got null",
            field="model.index_topk",
        )
    block_size = _one_block_size([layer for layer in distinct if isinstance(layer[1], MLASpec)])
    source, indexer, others = _by_role(layers, distinct)
    regular = regular_groups(others, request.device.kv_cache_layout, trace)
    _refuse_deepseek_v4(distinct)
    if not source or not indexer:
        raise PlanError(
            "layers: HiSparse needs both sparse (source) layers and indexer layers; got "
            f"{len(source)} with cache_role 'sparse' and {len(indexer)} with 'indexer'",
            field="layers",
        )
    hot = hot_buffer(
        [spec for _, spec in source], index_topk, hisparse.max_decode_query_len,
        hisparse.device_buffer_size, block_size,
    )
    trace.add("group", "5.4", "hot rows per request", hot.rows,
              lambda: f"top-k {hot.top_k}, max_decode_query_len "
              f"{hisparse.max_decode_query_len}: configured {hisparse.device_buffer_size}, "
              f"default (q + 1) * top-k")
    indexer_group = uniform_group(indexer, "hisparse_indexer")
    packs = hot_packs(source, indexer_group.group.spec.page_size_bytes)
    trace.add("group", "5.5", "hot packs", [len(pack.names) for pack in packs],
              lambda: f"units packed into indexer blocks of "
              f"{indexer_group.group.spec.page_size_bytes} bytes")
    hot_blocks = ceil_div(hot.rows, block_size)
    device = [
        indexer_group,
        *_derived_groups(packs, block_size, None),
        *_derived_groups(packs, block_size, hot_blocks),
        *regular,
    ]
    return HisparseGrouping(uniform_group(source, "hisparse_source"), device, hot, block_size)


def refuse_deferred(request: PlanRequest, distinct: list[Layer]) -> None:
    """What SPEC 4.1, 5.3 and 7.11 defer for HiSparse requests (`distinct`: the first layer of
    each spec)."""
    if request.device.pipeline_stages is not None:
        raise UnsupportedRequestError(
            "device.pipeline_stages: HiSparse plans one stage (see "
            "docs/planning-rules.md#deferred-modes); expected null",
            field="device.pipeline_stages",
        )
    if request.scheduler.disable_hybrid_kv_cache_manager:
        # vLLM's one-manager promotion refuses any HiSparse model: its resident and hot caches
        # are never one type with the MLA layers ("Failed to promote local KV cache specs").
        raise UnsupportedRequestError(
            "scheduler.disable_hybrid_kv_cache_manager: HiSparse's resident and hot caches need "
            "vLLM's hybrid KV cache manager (with it disabled vLLM refuses the model); expected "
            "false",
            field="scheduler.disable_hybrid_kv_cache_manager",
        )
    for name, spec in distinct:
        if not isinstance(spec, MLASpec):
            continue
        for attribute, default in (
            ("compress_ratio", 1), ("alignment", None), ("block_stride_alignment", None),
            ("page_size_padded", None),
        ):
            value = getattr(spec, attribute)
            if value != default:
                raise UnsupportedRequestError(
                    f"layers[{name!r}].{attribute}: HiSparse source and indexer layers do not "
                    "take it yet (see docs/planning-rules.md#deferred-modes); expected "
                    f"{default}, got {value}",
                    field=f"layers[{name!r}].{attribute}",
                )


def _refuse_deepseek_v4(distinct: list[Layer]) -> None:
    for name, spec in distinct:
        if isinstance(spec, MLASpec) and spec.model_version == "deepseek_v4":
            raise UnsupportedRequestError(
                f"layers[{name!r}].model_version: 'deepseek_v4' is not supported by HiSparse "
                "planning (see docs/planning-rules.md#hisparse-groups)",
                field=f"layers[{name!r}].model_version",
            )


def _by_role(
    layers: list[Layer], distinct: list[Layer]
) -> tuple[list[tuple[str, MLASpec]], list[tuple[str, MLASpec]], list[Layer]]:
    """Source (sparse MLA), indexer (indexer MLA) and other layers, each in request order."""
    source: list[tuple[str, MLASpec]] = []
    indexer: list[tuple[str, MLASpec]] = []
    others: list[Layer] = []
    part: dict[int, list[Any]] = {}  # each spec's list (Any: the MLA lists are narrower)
    for _, spec in distinct:
        if not isinstance(spec, MLASpec):
            part[id(spec)] = others
        else:
            part[id(spec)] = source if spec.cache_role == "sparse" else indexer
    for layer in layers:
        part[id(layer[1])].append(layer)
    return source, indexer, others


def _one_block_size(mla: Sequence[Layer]) -> int:
    if not mla:
        raise UnsupportedRequestError(
            "layers: HiSparse settings are given but no layer has kind 'mla'; expected sparse "
            "and indexer MLA layers, or hisparse null for a regular plan",
            field="layers",
        )
    first_name, first = mla[0]
    sizes = {spec.block_size for _, spec in mla}
    if len(sizes) == 1:
        return first.block_size
    for name, spec in mla:
        if spec.block_size != first.block_size:
            raise PlanError(
                f"layers[{name!r}].block_size: expected {first.block_size} like every MLA "
                f"layer (the first, {first_name!r}, has it), got {spec.block_size}",
                field=f"layers[{name!r}].block_size",
            )
    return first.block_size


def _derived_groups(
    packs: list[HotPack], block_size: int, hot_blocks: int | None
) -> list[PlannedGroup]:
    """One resident group per pack, or with `hot_blocks` one hot group per pack."""
    suffix = RESIDENT_SUFFIX if hot_blocks is None else HOT_SUFFIX
    specs: dict[int, HisparseResidentSpec | HisparseHotSpec] = {}
    groups = []
    for pack in packs:
        spec = specs.get(pack.page)
        if spec is None:
            with built_for(f"layers[{pack.names[0]!r}]", f"its {suffix[1:]} page"):
                spec = specs[pack.page] = (
                    HisparseResidentSpec(block_size=block_size, page_size_bytes=pack.page)
                    if hot_blocks is None
                    else HisparseHotSpec(
                        block_size=block_size, page_size_bytes=pack.page,
                        blocks_per_request=hot_blocks,
                    )
                )
        groups.append(single_spec_group(spec, [name + suffix for name in pack.names]))
    return groups
