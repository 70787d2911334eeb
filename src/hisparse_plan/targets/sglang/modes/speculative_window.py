"""A draft with sliding-window layers, as SGLang 0.5.23 sizes and builds it (gpt-oss drafting
with its own checkpoint, or any hybrid-window EAGLE draft), one rule a function.

The target's configurator (`HybridSWAPoolConfigurator`) prices the draft's layers at the
target's per-layer geometry: its full layers join the full part of the cell, its window layers
(`eagle_draft_swa_num_layers`, the draft config's swa_attention_layer_ids) the window part,
which counts at swa_full_tokens_ratio; with the radix cache off the window pool's request cap
(`SWARequestCapPoolConfigurator`) is priced with the draft's window layers in it. The draft
worker (`KVCacheConfigurator(is_draft_worker=True)`) then builds its own `SWAKVPool` from the
target's `memory_pool_config`: its full layers over the target's full tokens, its window layers
over the target's window tokens, both in the draft's one head geometry, indexed through the
target allocator's full-to-window mapping (one allocator hands out both)."""

from __future__ import annotations

from dataclasses import replace

from hisparse_plan.errors import UnsupportedRequestError
from hisparse_plan.models.sglang_settings import SGLangSettings
from hisparse_plan.targets.sglang.model import HeadGroup, SGLangModel

FIELD = "engine.speculative_draft_window_layer_ids"


def _refuse(field: str, why: str) -> UnsupportedRequestError:
    return UnsupportedRequestError(f"{field}: {why}", field=field)


def draft_window_ids(settings: SGLangSettings, draft_layers: int) -> tuple[int, ...]:
    """The draft's window layers by its own ids: as many as speculative_draft_window_layers,
    distinct, each one of the draft's layers, and at least one full layer left (SGLang's
    hybrid pool keeps the full layers' pool beside the window one)."""
    count = settings.speculative_draft_window_layers
    ids = settings.speculative_draft_window_layer_ids
    if ids is None:
        if count:
            raise _refuse(FIELD, (
                f"the draft has {count} window layers; expected their ids in the draft "
                "(SGLang's swa_attention_layer_ids of the draft config), got null"))
        return ()
    if len(ids) != count or len(set(ids)) != len(ids):
        raise _refuse(FIELD, (
            f"expected {count} distinct ids (speculative_draft_window_layers), got {ids}"))
    stray = [i for i in ids if i >= draft_layers]
    if stray:
        raise _refuse(FIELD, (
            f"expected ids of the draft's {draft_layers} layers (0 to {draft_layers - 1}), "
            f"got {stray[0]}"))
    if count and count == draft_layers:
        raise _refuse(FIELD, (
            "a draft of window layers only (no full-attention layer) is not planned; expected "
            f"fewer than {draft_layers} window layers, got {count}"))
    return tuple(sorted(ids))


def refuse_unplanned_window_draft(settings: SGLangSettings, model: SGLangModel) -> None:
    """A window draft beside a target whose pools SGLang's draft worker cannot size it from:
    one without a window pool (no window token count to share: SGLang fails building the
    draft's pool), or, where the target is a window hybrid, one whose window layers differ in
    head shape from its full ones (SGLang's compressed-window pools, not planned)."""
    if not settings.speculative_draft_window_layers:
        return
    swa = model.swa
    # A pipeline rank of window layers only: the model's full shape is its window layers'
    # (window_only.refuse_unlike_full_shape).
    full = model.full or swa
    if full is None or swa is None:
        raise _refuse("engine.speculative_draft_window_layers", (
            "a draft with sliding-window layers shares the target's full and window token "
            "counts (SGLang's memory_pool_config), which a target without both a full and a "
            "window pool has none of; expected 0, got "
            f"{settings.speculative_draft_window_layers}"))
    if (swa.heads, swa.head_dim, swa.v_head_dim) != (full.heads, full.head_dim,
                                                     full.v_head_dim):
        raise _refuse("engine.speculative_draft_window_layers", (
            "a window draft beside window layers of another head shape than the full ones "
            "(SGLang's compressed-window pools) is not planned; expected 0, got "
            f"{settings.speculative_draft_window_layers}"))


def split_draft_group(
    group: HeadGroup, full_names: tuple[str, ...], window_names: tuple[str, ...]
) -> tuple[HeadGroup, HeadGroup]:
    """The draft's one head geometry over its full layers and over its window layers: SGLang's
    draft `SWAKVPool` gives both sub-pools the draft config's heads and head_dim."""
    return replace(group, names=full_names), replace(group, names=window_names)
