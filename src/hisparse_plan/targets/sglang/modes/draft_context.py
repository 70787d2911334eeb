"""The context length a separate draft checkpoint takes (EAGLE / EAGLE3 with a draft of its
own): SGLang reads the draft's config.json as a ModelConfig handed the server's context_length,
and its `_derive_context_length` (configs/model_config.py) refuses one above the draft's own
derived length ("Target model's context_length ... is greater than the derived
context_length") unless SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1, with which it raises the
draft's max_position_embeddings to it (nothing it sizes changes). A read-stage rule (read.py)."""

from __future__ import annotations

from hisparse_plan.errors import UnsupportedRequestError
from hisparse_plan.models.sglang_settings import SGLangSettings


def refuse_shorter_draft_context(settings: SGLangSettings) -> None:
    """A draft checkpoint whose own context (speculative_draft_context_length) is shorter
    than the server's context_length is refused, as SGLang's draft ModelConfig refuses it,
    unless allow_overwrite_longer_context_len."""
    draft = settings.speculative_draft_context_length
    if (settings.speculative_algorithm is None or draft is None
            or settings.context_length <= draft or settings.allow_overwrite_longer_context_len):
        return
    raise UnsupportedRequestError(
        f"engine.context_length: SGLang refuses a draft checkpoint whose own context length "
        f"({draft}) is shorter than the server's unless "
        f"SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1; expected at most {draft} or "
        f"engine.allow_overwrite_longer_context_len true, got {settings.context_length}",
        field="engine.context_length",
    )
