"""The page SGLang 0.5.23 gives a Qwen3-Next / Qwen3.5-style hybrid linear-attention model on
SM100 (Blackwell): its model override (arg_groups/model_overrides/qwen3_5.py,
`_qwen3_5_hybrid_overrides`) picks the attention backend when none is given, trtllm_mha (pages
of 64) or triton (pages of 1), and sets the page with it, over any page given. A resolve-stage
rule (resolve.py)."""

from __future__ import annotations

from typing import Final

from hisparse_plan.models.sglang_settings import SGLangSettings
from hisparse_plan.targets.sglang.model import SGLangModel

QWEN3_5_HYBRID_ARCHITECTURES: Final = frozenset({
    "Qwen3NextForCausalLM", "Qwen3_5MoeForConditionalGeneration",
    "InternS2PreviewForConditionalGeneration", "InternS2MobiusForConditionalGeneration",
    "Qwen3_5ForConditionalGeneration",
})
"""The architectures `_qwen3_5_hybrid_overrides` is registered for."""
TRTLLM_MHA_PAGE: Final = 64
BLACKWELL_MAJOR: Final = 10


def default_backend_is_trtllm_mha(settings: SGLangSettings, model: SGLangModel) -> bool:
    """SGLang's get_default_attn_backend (model_override_base.py) for an MHA model on SM100:
    trtllm_mha when no draft tree runs (no speculative algorithm, or a top-k given, of 1, on
    no page above one token: is_no_spec_infer_or_topk_one) and the K and V rows are alike
    (else fa4); a speculative algorithm without a given top-k falls to flashinfer."""
    topk = settings.speculative_eagle_topk
    if settings.speculative_algorithm is not None and topk is None:
        return False
    if topk is not None and (topk != 1 or settings.page_size not in (None, 1)):
        return False
    groups = [g for g in (model.full, model.swa) if g is not None]
    return all(g.head_dim == g.v_head_dim for g in groups)


def hybrid_linear_page(settings: SGLangSettings, model: SGLangModel) -> int | None:
    """The page `_qwen3_5_hybrid_overrides` sets on SM100: 64 where it keeps trtllm_mha (the
    default backend is trtllm_mha, and the radix cache is off or a speculative algorithm
    runs: the only trtllm_mha case it moves to triton is the radix cache on without drafts,
    its Mamba strategy not yet resolved to extra_buffer when the override runs), else 1 (its
    triton backend); None where the override does not apply (another GPU or architecture)."""
    if (settings.compute_capability is None or settings.compute_capability[0] != BLACKWELL_MAJOR
            or settings.architecture not in QWEN3_5_HYBRID_ARCHITECTURES):
        return None
    trtllm = default_backend_is_trtllm_mha(settings, model) and (
        settings.disable_radix_cache or settings.speculative_algorithm is not None)
    return TRTLLM_MHA_PAGE if trtllm else 1


def mamba_strategy_page(settings: SGLangSettings, model: SGLangModel) -> int | None:
    """The page SGLang's Mamba radix strategy resolution reads (arg_groups/overrides.py,
    `_mamba_radix_cache_resolution`, "using the current page size"): it runs after the model
    overrides, so on SM100 a Qwen3.5-style hybrid's is the page `_qwen3_5_hybrid_overrides`
    set (hybrid_linear_page: 1 on triton over a given 16 makes a no-overlap run no_buffer);
    else the given one (None when not given)."""
    page = hybrid_linear_page(settings, model)
    return settings.page_size if page is None else page
