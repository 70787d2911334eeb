"""Pages a planner must refuse before grouping (SPEC 7.1, 5.13, 7.12 on alignment)."""

from __future__ import annotations

from collections.abc import Sequence

from hisparse_plan.errors import PlanError
from hisparse_plan.models import LatentLayerSpec, LayerSpec, MambaSpec

Layer = tuple[str, LayerSpec]


def check_pages(distinct: Sequence[Layer]) -> None:
    """Refuse an empty page, a Mamba padding below its states, and latent layers that differ
    only in alignment (7.12). `distinct`: each distinct spec once, with its first layer."""
    alignments: dict[tuple[object, ...], tuple[str, LatentLayerSpec]] = {}
    for name, spec in distinct:
        _check_page(name, spec)
        if isinstance(spec, LatentLayerSpec):
            twin_name, twin = alignments.setdefault(_all_but_alignment(spec), (name, spec))
            if twin.alignment != spec.alignment:
                raise PlanError(
                    f"layers[{name!r}].alignment: layers that differ only in alignment must "
                    "share one (see docs/planning-rules.md#window-merges); expected "
                    f"{twin.alignment} like {twin_name!r}, got "
                    f"{spec.alignment}",
                    field=f"layers[{name!r}].alignment",
                )


def _check_page(name: str, spec: LayerSpec) -> None:
    if isinstance(spec, MambaSpec):
        if spec.page_size_padded is not None and spec.page_size_padded < spec.content_bytes:
            raise PlanError(
                f"layers[{name!r}].page_size_padded: expected at least the {spec.content_bytes} "
                f"bytes of its states, got {spec.page_size_padded}",
                field=f"layers[{name!r}].page_size_padded",
            )
        return
    if spec.page_size_padded is not None and spec.page_size_padded < spec.natural_page_bytes:
        raise PlanError(
            f"layers[{name!r}].page_size_padded: expected at least its natural page of "
            f"{spec.natural_page_bytes} bytes, got {spec.page_size_padded}",
            field=f"layers[{name!r}].page_size_padded",
        )
    if spec.page_size_bytes == 0:
        ratio = spec.compress_ratio if isinstance(spec, LatentLayerSpec) else 1
        raise PlanError(
            f"layers[{name!r}]: block_size {spec.block_size} stores no state at compress_ratio "
            f"{ratio}; expected block_size >= compress_ratio (a page of at least one state)",
            field=f"layers[{name!r}].block_size",
        )


def _all_but_alignment(spec: LatentLayerSpec) -> tuple[object, ...]:
    return tuple(
        value
        for key, value in spec.__dict__.items()
        if key not in ("alignment", "page_size_bytes")
    )
