"""SPEC 7.3 rule 1 as vLLM tests it: layers are "one spec" when their specs merge.

Equal specs merge. vLLM also merges full-attention specs that differ only in the window or chunk
a promoted local layer remembers (at most one of each, not both), and mla specs that differ only
in the window a promoted sliding_window_mla layer remembers; the merged spec carries that one
window or chunk (an mla merge keeps none). An mla merge (vLLM's `MLAAttentionSpec.merge`)
compares the padded page an `alignment` gives, not the alignment itself: a promoted
sliding_window_mla layer of another alignment but the same page merges, into a spec without
alignment that keeps the first layer's padded page.
"""

from __future__ import annotations

from collections.abc import Sequence

from hisparse_plan.errors import PlanError
from hisparse_plan.models import FullAttentionSpec, LayerSpec, MLASpec

_REMEMBERED = ("sliding_window", "attention_chunk_size", "page_size_bytes")


def merged_spec(distinct: Sequence[LayerSpec]) -> LayerSpec | None:
    """The one spec `distinct` (each distinct spec once, request order) merge into, or None."""
    first = distinct[0]
    if len(distinct) == 1:
        return first
    if not isinstance(first, FullAttentionSpec | MLASpec):
        return None
    kind = type(first)
    alike = [spec for spec in distinct if isinstance(spec, kind)]
    if len(alike) < len(distinct):
        return None
    base = _merged_fields(first)
    if any(_merged_fields(spec) != base for spec in alike):
        return None
    if isinstance(first, MLASpec):
        return MLASpec.model_validate(base)
    windows = {spec.sliding_window for spec in alike} - {None}
    chunks = {
        spec.attention_chunk_size for spec in alike if isinstance(spec, FullAttentionSpec)
    } - {None}
    if len(windows) > 1 or len(chunks) > 1 or (windows and chunks):
        return None
    return FullAttentionSpec.model_validate({
        **base,
        "sliding_window": next(iter(windows), None),
        "attention_chunk_size": next(iter(chunks), None),
    })


def _merged_fields(spec: FullAttentionSpec | MLASpec) -> dict[str, object]:
    fields = {key: value for key, value in spec.__dict__.items() if key not in _REMEMBERED}
    if isinstance(spec, MLASpec):
        # vLLM's MLAAttentionSpec.merge compares the page an alignment pads to, not the
        # alignment (a field of its own that the merge leaves out).
        fields["alignment"] = None
        fields["page_size_padded"] = _padded_page(spec)
    return fields


def _padded_page(spec: MLASpec) -> int | None:
    """The padded page (explicit, or from `alignment`), None when the page is natural."""
    page = spec.page_size_bytes
    return None if page == spec.natural_page_bytes and spec.page_size_padded is None else page


def refuse_mixed_windows(layers: Sequence[tuple[str, LayerSpec]], field: str) -> None:
    """vLLM's merge test of a set of layers, where it refuses instead of answering.

    vLLM tests whether layers are one spec by merging them (`is_kv_cache_spec_uniform`), and a
    full-attention merge collects the windows and the chunks the layers remember before it
    compares anything else: when every layer is full attention (no mla among them) and they
    remember two window sizes, or two chunk sizes, `merge_window_sizes` raises ("All attention
    layers in the same KV cache group must have the same window size.") where a mismatch of
    any other field only answers "not one spec". With the hybrid manager disabled vLLM runs
    this test on the promoted layers, so two chunked-local (or sliding-window) sizes beside
    full attention are refused, and so is the plan.
    """
    if not layers or not all(isinstance(spec, FullAttentionSpec) for _, spec in layers):
        return
    # vLLM merges the windows before the chunks: a set with both kinds of mix names windows.
    for key, what in (("sliding_window", "a sliding window"),
                      ("attention_chunk_size", "chunks")):
        seen: dict[int, str] = {}
        for name, spec in layers:
            size = getattr(spec, key)
            if size is not None:
                seen.setdefault(size, name)
        if len(seen) > 1:
            (first, first_name), (other, other_name) = list(seen.items())[:2]
            raise PlanError(
                f"{field}: every attention layer in one vLLM KV cache group must have the same "
                f"window size, but {first_name!r} keeps {what} of {first} tokens and "
                f"{other_name!r} of {other} once local-attention layers take full blocks; "
                "vLLM refuses this model with the hybrid KV cache manager disabled (see "
                "docs/planning-rules.md#hybrid-manager-disabled): expected one "
                f"{key} for these layers, or the hybrid manager on (false)",
                field=field,
            )
