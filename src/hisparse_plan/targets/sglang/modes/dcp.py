"""SGLang's decode context parallelism for DSA models (`--dcp-size N`): each rank of a group of
N keeps every Nth token of a request in its latent pool, so the allocator hands out N token ids
a stored row (and its page is N pages wide), while the index keys stay replicated: every rank
keeps them for all N x tokens ids; the DSA backends it sets. Rules of the resolve stage (the
refusal, the backends) and the size stage
(the index keys' share of a token, their tokens), one function each."""

from __future__ import annotations

from hisparse_plan.errors import UnsupportedRequestError
from hisparse_plan.models.sglang_settings import SGLangSettings
from hisparse_plan.targets.sglang.model import SGLangModel
from hisparse_plan.targets.sglang.modes.parallel import attn_tp_size


def refuse_dcp(settings: SGLangSettings, model: SGLangModel) -> None:
    """Decode context parallelism is planned for DSA models without HiSparse (SGLang refuses
    HiSparse's sharded host pool with it); the heads of other models' layers would shard over
    tp / dcp ranks, which is not planned."""
    dcp = settings.dcp_size
    if dcp == 1:
        return
    if model.latent is None or not model.latent.is_dsa:
        raise UnsupportedRequestError(
            f"engine.dcp_size: SGLang's decode context parallelism is planned for DSA models "
            f"(replicated index keys, sharded latent rows); expected 1 for this model, got {dcp}",
            field="engine.dcp_size",
        )
    if settings.enable_hisparse:
        raise UnsupportedRequestError(
            f"engine.dcp_size: SGLang refuses HiSparse with decode context parallelism (its host "
            f"pool would shard); expected 1 with enable_hisparse, got {dcp}",
            field="engine.dcp_size",
        )
    attn_tp = attn_tp_size(settings)
    if attn_tp % dcp:
        raise UnsupportedRequestError(
            f"engine.dcp_size: SGLang shards a context over ranks of one attention group; "
            f"expected a divisor of its {attn_tp} ranks, got {dcp}",
            field="engine.dcp_size",
        )


def dcp_dsa_backends(settings: SGLangSettings) -> tuple[str, str] | None:
    """(prefill, decode) DSA backends under decode context parallelism: SGLang's
    `_dsa_dcp_overrides` (arg_groups/model_overrides/deepseek_v2.py) sets every unset DSA
    backend to trtllm when dcp_size > 1, so an fp8 cache keeps raw 576-byte latent rows; None
    without DCP or with a backend given (the given one runs both)."""
    if settings.dcp_size <= 1 or settings.dsa_backend is not None:
        return None
    return "trtllm", "trtllm"


def index_token_scale(settings: SGLangSettings) -> int:
    """Index-key rows one stored token is charged: HiSparse's host_to_device_ratio (the keys
    cover the host token space), dcp_size under decode context parallelism (they cover every
    rank's token ids), else 1."""
    if settings.enable_hisparse:
        return settings.hisparse_host_to_device_ratio
    return settings.dcp_size


def index_tokens(settings: SGLangSettings, tokens: int, page_size: int) -> int:
    """Index-key rows of a DSA pool of `tokens` stored rows (HiSparse aside): under decode
    context parallelism every rank's token ids and pages, (tokens + page) x dcp_size less the
    padding page (SGLang's DSATokenToKVPool index_buf_size); else the tokens."""
    return (tokens + page_size) * settings.dcp_size - page_size


def token_ids(settings: SGLangSettings, tokens: int) -> int:
    """Token ids the allocator hands out for `tokens` stored rows: dcp_size a row."""
    return tokens * settings.dcp_size
