"""SPEC 7.3 rule 1 as vLLM tests it: layers are "one spec" when their specs merge.

Equal specs merge. vLLM also merges full-attention specs that differ only in the window or chunk
a promoted local layer remembers (at most one of each, not both), and mla specs that differ only
in the window a promoted sliding_window_mla layer remembers; the merged spec carries that one
window or chunk (an mla merge keeps none).
"""

from __future__ import annotations

from collections.abc import Sequence

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
    return {key: value for key, value in spec.__dict__.items() if key not in _REMEMBERED}
