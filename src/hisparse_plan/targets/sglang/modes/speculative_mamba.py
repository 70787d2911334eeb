"""Speculative decoding on a Mamba hybrid, as SGLang 0.5.23 sizes it
(`KVCacheConfigurator._handle_max_mamba_cache`, `MambaPool`'s SpeculativeState): the target
verifies the draft tokens by keeping, for each running request, one recurrent state and one
conv window per draft token. Those intermediate states come off the budget with the state
slots, and their pools hold max_running_requests + 1 slots (slot 0 pads). The size stage's
rule (size.py) and the place stage's pools (place.py)."""

from __future__ import annotations

from hisparse_plan.errors import CapacityError
from hisparse_plan.models.sglang_settings import SGLangSettings
from hisparse_plan.targets.sglang.layout import Placed, mamba_state_pool
from hisparse_plan.targets.sglang.model import MambaGroup
from hisparse_plan.targets.sglang.modes.parallel import attn_dp_size, requests_per_worker
from hisparse_plan.targets.sglang.modes.radix import mamba_slots_per_request
from hisparse_plan.targets.sglang.modes.speculative import Speculative
from hisparse_plan.targets.sglang.sizing import GIB, MambaBudget

INTERMEDIATE_SSM = "mamba_intermediate_ssm"
INTERMEDIATE_CONV = "mamba_intermediate_conv0"


def speculative_mamba_budget(
    settings: SGLangSettings, rest_gb: float, slot_bytes: int, spec: Speculative,
    strategy_page: int | None,
) -> MambaBudget:
    """The state slots and what is left for the KV cache when each running request also keeps
    `num_draft_tokens` intermediate states (one slot's bytes each). `settings` carry the
    running requests SGLang resolved (48 by default with speculative decoding). Slots: a given
    max_mamba_cache_size (per DP group); else with the radix cache off one a request; else the
    states' share of the budget solved jointly for slots and intermediates: (share - slot x
    (1 + D)) // (slot x (1 + D / r)), r the slots a request holds. The intermediates are
    reserved for min(requests, slots // r) requests and a padding one (r from
    `strategy_page`, the page SGLang's Mamba strategy resolution reads)."""
    draft = spec.num_draft_tokens
    ratio = mamba_slots_per_request(settings, strategy_page)
    requests = settings.max_running_requests or 1  # speculative_requests always sets it
    per_group = requests_per_worker(settings, requests)
    if settings.max_mamba_cache_size is not None:
        slots = settings.max_mamba_cache_size // attn_dp_size(settings)
        reserved = min(per_group, slots // ratio)
    elif settings.disable_radix_cache:
        slots = per_group
        reserved = slots
    else:
        share = settings.mamba_full_memory_ratio
        budget_bytes = rest_gb * share / (1 + share) * GIB
        slots = int((budget_bytes - slot_bytes * (1 + draft) - 0)
                    // (slot_bytes * (1 + draft / ratio) + 0))
        reserved = min(per_group, slots // ratio)
    if slots <= 0:
        raise CapacityError(
            f"engine: the budget holds no Mamba state slot beside the draft tokens' "
            f"intermediate states; expected at least one slot of {slot_bytes} bytes, got "
            f"{slots} (lower speculative_num_draft_tokens or max_running_requests)",
            field="engine.speculative_num_draft_tokens",
        )
    rest_gb = rest_gb - (slot_bytes * (reserved + 1) * draft / GIB)
    state_gb = ((slots + 1) * (slot_bytes + 0) + 0) / GIB
    return MambaBudget(slots, rest_gb - state_gb)


def intermediate_pools(
    group: MambaGroup, requests: int, spec: Speculative, conv_dtype: str, ssm_dtype: str
) -> Placed:
    """The target's intermediate states for `requests` running requests and a padding slot:
    `mamba_intermediate_ssm` [layers, requests + 1, draft tokens, *temporal], and the conv
    windows `mamba_intermediate_conv0`: with a draft chain (top-k 1) the CUDA allocation that
    shares the windows' overlap, [layers, requests + 1, dim, draft tokens + kernel - 2]; with a
    tree, one window a draft token [layers, requests + 1, draft tokens, dim, kernel - 1]."""
    draft = spec.num_draft_tokens
    slots = requests + 1
    placed = mamba_state_pool(INTERMEDIATE_SSM, "intermediate_ssm", group.names, slots,
                              (draft, *group.temporal_shape), ssm_dtype)
    dim, window = group.conv_shape
    # A chain's step t reads columns t .. t + kernel - 2 of one shared row a channel (SGLang's
    # as_strided view over this allocation); a tree keeps each step's window whole.
    shape = (draft, dim, window) if spec.eagle_topk > 1 else (dim, draft + window - 1)
    return placed + mamba_state_pool(INTERMEDIATE_CONV, "intermediate_conv_window[0]",
                                     group.names, slots, shape, conv_dtype)
