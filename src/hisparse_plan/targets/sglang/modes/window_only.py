"""A pipeline rank of a window hybrid that keeps window layers only, or full layers only, as
SGLang 0.5.23 sizes it. Every rank runs the window hybrid's configurator
(HybridSWAPoolConfigurator, model_executor/pool_configurator.py) over its own layers:

* a rank of window layers only is its "all SWA" case: the cell is the window layers' bytes
  with no swa_full_tokens_ratio (there is no full pool to relate them to), the window pool
  holds every token of max_total_num_tokens and no full pool is built; its allocator,
  PureSWATokenToKVPoolAllocator (mem_cache/allocator/swa.py), asserts page_size 1; with the
  radix cache off the window pool is not capped for the running requests there
  (SWARequestCapPoolConfigurator.is_applicable wants full layers on the rank);
* a rank of full layers only fails the configurator's assertion of a window layer.

The ranks' MIN of max_total_num_tokens then applies as to any rank (pipeline_stages.py)."""

from __future__ import annotations

from hisparse_plan.errors import UnsupportedRequestError
from hisparse_plan.models.layer_specs import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    SlidingWindowSpec,
)
from hisparse_plan.models.request import PlanRequest
from hisparse_plan.models.sglang_settings import SGLangSettings
from hisparse_plan.targets.sglang.model import SGLangModel
from hisparse_plan.targets.sglang.modes.pipeline_stages import Stage, hosts_draft_worker


def _rank(stage: Stage | None) -> str:
    if stage is None:
        return "the rank"
    return f"pipeline rank {stage.rank}, decoder layers [{stage.start}, {stage.end}),"


def refuse_unlike_full_shape(
    request: PlanRequest, model: SGLangModel, settings: SGLangSettings
) -> None:
    """A rank of window layers only prices a draft's full layers at the model's full-layer
    shape (SGLang's configurator reads it from the model config), of which the rank keeps no
    layer: planned where every attention layer of the model has the rank's window shape (as in
    gpt-oss and Llama-4), refused otherwise."""
    swa = model.swa
    if settings.speculative_algorithm is None or not model.window_layers_only or swa is None:
        return
    want = (swa.heads, swa.head_dim, swa.v_head_dim, swa.dtype)
    for name, spec in request.layers.items():
        if not isinstance(spec, FullAttentionSpec | SlidingWindowSpec |
                          ChunkedLocalAttentionSpec):
            continue
        got = (spec.num_kv_heads, spec.head_size, spec.value_head_size, spec.dtype)
        if got != want:
            raise UnsupportedRequestError(
                f"layers[{name!r}]: a pipeline rank of window layers only prices the draft's "
                "full layers at the model's full-layer shape, planned where every attention "
                f"layer has the window layers' (num_kv_heads, head_size, head_size_v, dtype); "
                f"expected {want}, got {got}", field=f"layers[{name!r}]",
            )


def refuse_full_only_rank(model: SGLangModel, stage: Stage | None, hybrid: bool) -> None:
    """A rank of a window hybrid (`hybrid`) with full-attention layers and no window layer:
    SGLang's window configurator asserts a window layer on every rank, so the server fails."""
    if stage is None or not hybrid or model.swa is not None or model.full is None:
        return
    raise UnsupportedRequestError(
        f"engine.pp_size: {_rank(stage)} keeps full-attention layers only of a window hybrid, "
        "and SGLang's window-pool configurator asserts a window layer on every rank "
        "(HybridSWAPoolConfigurator); expected every rank to keep a window layer (another "
        f"pp_size than {stage.size})", field="engine.pp_size",
    )


def refuse_window_only_settings(
    stage: Stage | None, page_size: int, draft_window_layers: int
) -> None:
    """What SGLang cannot run on a rank of window layers only: pages above one token (its
    all-window allocator asserts page_size 1), and, on the last rank, which runs the draft
    worker, a draft with window layers: its pool is a window hybrid's too, whose full part
    gets the rank's full tokens, none, while its full layers write their KV at the ids the
    all-window allocator hands out (SWAKVPool.set_kv_buffer takes a full layer's loc as is),
    up to the window pool's size: past the one padding page the full part has."""
    where = _rank(stage)
    if page_size != 1:
        raise UnsupportedRequestError(
            f"engine.page_size: {where} keeps window layers only, and SGLang's all-window "
            f"allocator (PureSWATokenToKVPoolAllocator) asserts pages of one token; expected "
            f"1, got {page_size}", field="engine.page_size",
        )
    if draft_window_layers and hosts_draft_worker(stage):
        raise UnsupportedRequestError(
            f"engine.speculative_draft_window_layers: {where} keeps window layers only and "
            "runs the draft worker, whose window-hybrid pool's full part then holds no token "
            "while the draft's full layers write at the all-window allocator's ids (SGLang "
            "builds it, and the first write lands past the pool); expected a draft without "
            "window layers, or a split whose last rank keeps a full-attention layer",
            field="engine.speculative_draft_window_layers",
        )
