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
from hisparse_plan.models.sglang_settings import SGLangSettings
from hisparse_plan.targets.sglang.model import SGLangModel
from hisparse_plan.targets.sglang.pipeline_stages import Stage


def window_only_rank(model: SGLangModel) -> bool:
    """The rank keeps window layers and no full-attention or latent layer."""
    return model.swa is not None and model.full is None and model.latent is None


def _rank(stage: Stage | None) -> str:
    if stage is None:
        return "the rank"
    return f"pipeline rank {stage.rank}, decoder layers [{stage.start}, {stage.end}),"


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
    settings: SGLangSettings, stage: Stage | None, page_size: int, draft_full_layers: int
) -> None:
    """What SGLang cannot run on a rank of window layers only: pages above one token (its
    all-window allocator asserts page_size 1); and what this planner does not price there: a
    draft's full layers (SGLang charges them at the model's full-layer geometry, which the
    rank lacks)."""
    where = _rank(stage)
    if page_size != 1:
        raise UnsupportedRequestError(
            f"engine.page_size: {where} keeps window layers only, and SGLang's all-window "
            f"allocator (PureSWATokenToKVPoolAllocator) asserts pages of one token; expected "
            f"1, got {page_size}", field="engine.page_size",
        )
    if draft_full_layers:
        raise UnsupportedRequestError(
            f"engine.speculative_algorithm: {where} keeps window layers only; a draft's "
            f"full-attention layers ({draft_full_layers}) priced on such a rank are not "
            f"planned; expected no speculative decoding, got {settings.speculative_algorithm}",
            field="engine.speculative_algorithm",
        )
