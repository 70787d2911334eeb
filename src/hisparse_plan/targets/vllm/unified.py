"""Unified pages (SPEC 7.3.2), and the full-allocation fallback (7.3.3) when they cannot be."""

from __future__ import annotations

from collections.abc import Sequence

from hisparse_plan.errors import PlanError
from hisparse_plan.models import (
    ChunkedLocalAttentionSpec,
    LayerSpec,
    MambaSpec,
    MLASpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
    spec_key,
)
from hisparse_plan.models.base import built_for
from hisparse_plan.rules.arith import ceil_div
from hisparse_plan.targets.trace import Trace
from hisparse_plan.targets.vllm.groups import Layer, PlannedGroup, single_spec_group, uniform_group
from hisparse_plan.targets.vllm.rules.families import one_family
from hisparse_plan.targets.vllm.rules.promotion import promote_local_layers
from hisparse_plan.targets.vllm.rules.window_merges import refuse_bucket_merge


class _CannotUnify(Exception):
    """An MLA page that does not divide the largest page (7.3.2 step 1)."""

    def __init__(self, name: str, spec: LayerSpec, page: int) -> None:
        super().__init__(name)
        self.name, self.spec, self.page = name, spec, page


def unified_groups(layers: Sequence[Layer], trace: Trace) -> list[PlannedGroup]:
    try:
        unified = unify_pages(layers, trace)
    except _CannotUnify as stop:
        return full_allocation_fallback(layers, stop, trace)
    buckets: dict[int, list[str]] = {}
    spec_of: dict[int, LayerSpec] = {}
    for name, spec in unified:
        buckets.setdefault(id(spec), []).append(name)
        spec_of[id(spec)] = spec
    refuse_bucket_merge([(names[0], spec_of[key]) for key, names in buckets.items()])
    counts = [len(names) for names in buckets.values()]
    smallest, largest = min(counts), max(counts)
    group_size = largest if 2 * largest < 3 * smallest else smallest
    trace.add("group", "7.3.2 step 3", "group_size", group_size,
              lambda: f"buckets of {counts} layers: smallest {smallest}, largest {largest}")
    groups = []
    for key, names in buckets.items():
        count = ceil_div(len(names), group_size)
        for i in range(count):
            groups.append(single_spec_group(spec_of[key], names[i::count]))
    return groups


def unify_pages(layers: Sequence[Layer], trace: Trace) -> list[Layer]:
    """Step 1: every layer's page made the largest page P, by block scaling or padding."""
    largest = max(spec.page_size_bytes for _, spec in layers)
    made: dict[int, LayerSpec] = {}  # by spec identity: one spec is unified once
    equal: dict[tuple[object, ...], LayerSpec] = {}  # two specs may become one spec
    unified = []
    for name, spec in layers:
        new = made.get(id(spec))
        if new is None:
            with built_for(f"layers[{name!r}]", f"its page unified to {largest} bytes"):
                new = _unify(name, spec, largest)
            new = made[id(spec)] = equal.setdefault(spec_key(new), new)
            if new is not spec and trace.enabled:
                trace.add("group", "7.3.2 step 1", f"layers[{name!r}]", new.page_size_bytes,
                          f"{spec.kind} page {spec.page_size_bytes} -> {new.page_size_bytes} "
                          f"(block {spec.block_size} -> {new.block_size})")
        unified.append((name, new))
    return unified


def _unify(name: str, spec: LayerSpec, largest: int) -> LayerSpec:
    page = spec.page_size_bytes
    if page == largest:
        return spec
    if isinstance(spec, MambaSpec):
        if largest % spec.state_alignment:
            raise PlanError(
                f"layers[{name!r}].state_alignment: padding its page to the largest page "
                f"{largest} needs a multiple of state_alignment {spec.state_alignment}; expected "
                "pages that line up (vLLM fails here with an assertion)",
                field=f"layers[{name!r}].state_alignment",
            )
        return _replace(spec, page_size_padded=largest)
    if largest % page == 0:
        scaled = _replace(spec, block_size=spec.block_size * (largest // page))
        if scaled.page_size_bytes != largest:
            raise PlanError(
                f"layers[{name!r}]: scaling its block size to "
                f"{scaled.block_size} gives a {scaled.page_size_bytes}-byte page; expected "
                f"the largest page {largest} (see docs/planning-rules.md#unified-pages)",
                field=f"layers[{name!r}]",
            )
        return scaled
    if isinstance(spec, MLASpec):
        raise _CannotUnify(name, spec, largest)
    if isinstance(spec, SlidingWindowMLASpec) and spec.alignment is not None and (
        spec.natural_page_bytes % spec.alignment
    ):
        raise PlanError(
            f"layers[{name!r}]: its page is padded to alignment {spec.alignment} "
            f"({page} bytes), so it cannot also be padded to the largest page {largest} "
            "(see docs/planning-rules.md#unified-pages)",
            field=f"layers[{name!r}].alignment",
        )
    return _replace(spec, page_size_padded=largest)


def full_allocation_fallback(
    layers: Sequence[Layer], stop: _CannotUnify, trace: Trace
) -> list[PlannedGroup]:
    """7.3.3: sliding-window layers (sliding_window_mla too, as in vLLM 0.34) beside MLA take
    full blocks, in one uniform_type group."""
    specs = [spec for _, spec in layers]
    has_chunked = any(isinstance(s, ChunkedLocalAttentionSpec) for s in specs)
    has_mla = any(isinstance(s, MLASpec) for s in specs)
    has_window = any(isinstance(s, SlidingWindowSpec | SlidingWindowMLASpec) for s in specs)
    why = (
        f"pages cannot be unified: the MLA page of {stop.name!r} ({stop.spec.page_size_bytes} "
        f"bytes) does not divide the largest page {stop.page} and MLA pages cannot be padded"
    )
    if has_chunked or not (has_mla and has_window):
        raise PlanError(
            f"layers[{stop.name!r}]: {why}; the full-allocation fallback needs sliding-window "
            "layers beside the MLA layers and no chunked_local_attention layer",
            field=f"layers[{stop.name!r}]",
        )
    result, count = promote_local_layers(layers)
    if not one_family([spec for _, spec in result]):
        raise PlanError(
            f"layers[{stop.name!r}]: {why}, and with sliding-window layers promoted to full "
            "attention the layers are still not one family",
            field=f"layers[{stop.name!r}]",
        )
    trace.add("group", "7.3.3", "strategy", "full-allocation fallback",
              lambda: f"{why}; {count} sliding-window layer(s) promoted to full")
    return [uniform_group(result)]


def _replace(spec: LayerSpec, **changes: int) -> LayerSpec:
    """The spec with `changes`, its page derived anew."""
    fields = {k: v for k, v in spec.__dict__.items() if k != "page_size_bytes"}
    return type(spec).model_validate({**fields, **changes})
