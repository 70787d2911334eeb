"""SGLang's sizing rules, one function each, the size stage's (size.py): bytes per token, the
KV budget, the Mamba states' share, the token counts, the request count, the request-to-token
table and HiSparse's token counts. The server defaults they start from are defaults.py's.

Where SGLang computes in floats (GB figures, ratios) these functions do the same operations
in the same order, so their results match SGLang's to the bit."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from hisparse_plan.errors import CapacityError, UnsupportedRequestError
from hisparse_plan.models.pools import BUFFER_DTYPE_SIZE
from hisparse_plan.models.sglang_settings import SGLangSettings
from hisparse_plan.targets.sglang.bounds import refuse_table_past_int64, refuse_unbounded
from hisparse_plan.targets.sglang.model import (
    INDEX_ROW_BYTES,
    HeadGroup,
    LatentGroup,
    MambaGroup,
    SGLangModel,
    state_elements,
)
from hisparse_plan.targets.sglang.modes.dcp import index_token_scale
from hisparse_plan.targets.sglang.modes.parallel import attn_dp_size, requests_per_worker
from hisparse_plan.targets.sglang.modes.pipeline_stages import zero_cell_tokens
from hisparse_plan.targets.sglang.modes.radix import mamba_slots_per_request, radix_off_mamba_slots

GIB: Final = 1 << 30
REQUESTS_PER_CONTEXT: Final = 512
MIN_ESTIMATED_REQUESTS: Final = 2048
MAX_ESTIMATED_REQUESTS: Final = 4096
REQ_TO_TOKEN_EXTRA: Final = 4


def element_size(dtype: str) -> int:
    return BUFFER_DTYPE_SIZE[dtype]


@dataclass(frozen=True)
class CellSize:
    """Bytes one token takes over the pools SGLang counts (`total`), and its parts."""

    full: int
    """Full-attention (or latent) bytes per token, all layers, index keys included."""
    swa: int
    """Window-pool bytes per window token, all window layers."""
    total: int | float
    window_only: bool = False
    """A pipeline rank of window layers only: the total is the window bytes, no ratio."""


def mha_token_bytes(group: HeadGroup, dtype: str) -> int:
    """One token of one MHA pool, all its layers: heads x (K + V elements) x element size."""
    return group.heads * (group.head_dim + group.v_head_dim) * element_size(dtype) * len(
        group.names
    )


def index_token_bytes(latent: LatentGroup, scale: int, hisparse: bool) -> int:
    """DSA index keys of one token, all layers: 132 bytes a layer that runs an indexer (a layer
    sharing another's index has none), every layer with HiSparse, whose keys also cover the
    whole host token space, so each device token is charged `host_to_device_ratio` times
    (`scale`); under decode context parallelism every rank's ids, dcp_size times."""
    layers = len(latent.names) if hisparse else len(latent.index_names)
    return INDEX_ROW_BYTES * layers * scale


def cell_size(
    settings: SGLangSettings,
    model: SGLangModel,
    row_bytes: int,
    swa_ratio: float,
    dtypes: tuple[str | None, str | None],
) -> CellSize:
    """Bytes per token of max_total_num_tokens. MHA and MLA/DSA: every attention layer's row
    (index keys included); Mamba hybrids count only their attention layers (the states come off
    the budget first); with window layers, the window pool counts `swa_ratio` of a token, so
    the total is a float, computed as SGLang does: full + ratio * window. `row_bytes`: a latent
    row's bytes; `dtypes`: the full and window pools' cache dtypes (None without the pool)."""
    full_dtype, swa_dtype = dtypes
    if model.latent is not None:
        ratio = index_token_scale(settings)
        full = row_bytes * len(model.latent.names)
        if model.latent.is_dsa:
            full += index_token_bytes(model.latent, ratio, settings.enable_hisparse)
        return CellSize(full, 0, full)
    if model.window_layers_only and model.swa is not None and swa_dtype is not None:
        # modes/window_only.py: a rank's all-window cell
        swa = mha_token_bytes(model.swa, swa_dtype)
        return CellSize(0, swa, swa, window_only=True)
    if model.mamba_layers_only:
        return CellSize(0, 0, 0)  # no KV layer on the rank
    if model.full is None or full_dtype is None:  # read_model refuses such a model first
        raise UnsupportedRequestError(
            "layers: SGLang needs attention layers beside the others; expected full "
            "attention or MLA layers, got none", field="layers",
        )
    full = mha_token_bytes(model.full, full_dtype)
    if model.swa is None or swa_dtype is None:
        return CellSize(full, 0, full)
    swa = mha_token_bytes(model.swa, swa_dtype)
    return CellSize(full, swa, full + swa_ratio * swa)


def mamba_layer_slot_bytes(group: MambaGroup, conv_dtype: str, ssm_dtype: str) -> int:
    """Bytes of one state slot of one Mamba layer (SGLang's mamba_cache_per_req is this over
    every Mamba layer: pipeline_stages.stage_slot_bytes)."""
    return (
        state_elements(group.conv_shape) * element_size(conv_dtype)
        + state_elements(group.temporal_shape) * element_size(ssm_dtype)
    )


def rest_memory_gb(
    settings: SGLangSettings, available_bytes: int, fraction: float | None
) -> tuple[float, float | None]:
    """GB (2**30 bytes, a float as in SGLang) left for the KV cache and Mamba states, and the
    mem_fraction_static used. With pre_model_load_free_bytes and post_weights_free_bytes:
    free-after-weights - free-before-weights * (1 - fraction) (weights and the runtime's slack
    come off), `fraction` being `static_fraction`'s; else device.available_bytes is the budget
    itself. Without a fraction (none given, no gpu_memory_bytes for SGLang's rule) the formula
    cannot run."""
    if settings.pre_model_load_free_bytes is None or settings.post_weights_free_bytes is None:
        return available_bytes / GIB, None
    if fraction is None:
        raise UnsupportedRequestError(
            "engine.mem_fraction_static: SGLang's default fraction depends on the GPU's total "
            "memory; expected a fraction, or gpu_memory_bytes for SGLang's rule, beside "
            "pre_model_load_free_bytes and post_weights_free_bytes, got null",
            field="engine.mem_fraction_static",
        )
    pre_gb = settings.pre_model_load_free_bytes / GIB
    post_gb = settings.post_weights_free_bytes / GIB
    slack_gb = pre_gb * (1 - fraction)
    return post_gb - slack_gb, fraction


@dataclass(frozen=True)
class MambaBudget:
    slots: int
    """max_mamba_cache_size: state slots requests may take (slot 0 comes on top)."""
    rest_gb: float
    """What is left for the KV cache, GB."""


def mamba_budget(
    settings: SGLangSettings, rest_gb: float, slot_bytes: int
) -> MambaBudget:
    """Mamba states come off the budget before the KV cache is sized. Slots: the given
    `--max-mamba-cache-size`, else the states' share rest * r / (1 + r) (r =
    mamba_full_memory_ratio) divided by a slot's bytes, one slot (the padding slot 0) taken off
    first (a given count is the server's: each attention DP group keeps given // groups; with
    the radix cache off and max_running_requests given, one slot a request of a group). The
    KV cache gets the rest less (slots + 1) slots."""
    slots = settings.max_mamba_cache_size
    if slots is not None:
        slots //= attn_dp_size(settings)
    else:
        slots = radix_off_mamba_slots(settings)
    if slots is None:
        ratio = settings.mamba_full_memory_ratio
        budget_bytes = rest_gb * ratio / (1 + ratio) * GIB
        refuse_unbounded(budget_bytes, "engine.mamba_full_memory_ratio",
                         "the Mamba states' share of the budget in bytes")
        slots = int((budget_bytes - 0 - slot_bytes) // slot_bytes)
    if slots <= 0:
        raise CapacityError(
            f"engine: the budget holds no Mamba state slot; expected at least one slot of "
            f"{slot_bytes} bytes (plus the padding slot), got {slots} slots from "
            f"{rest_gb * GIB:.0f} bytes",
            field="engine.mamba_full_memory_ratio",
        )
    state_gb = ((slots + 1) * slot_bytes + 0) / GIB
    return MambaBudget(slots, rest_gb - state_gb)


def kv_budget_bytes(rest_gb: float) -> int:
    """The KV cache's bytes: SGLang's int(rest GB * 2**30); none left is a refusal."""
    if rest_gb <= 0:
        raise CapacityError(
            f"device: no memory is left for the KV cache; expected a positive budget, got "
            f"{rest_gb * GIB:.0f} bytes (raise mem_fraction_static or the free memory)",
            field="device.available_bytes",
        )
    return int(rest_gb * GIB)


def floor_page(tokens: int, page_size: int) -> int:
    return tokens // page_size * page_size


def max_total_num_tokens(available_bytes: int, cell: CellSize, page_size: int) -> int:
    """Tokens of the full pool: the budget over the cell size, floored to a whole page (an
    integer division; with window layers the float division SGLang does, then int)."""
    if cell.total == 0:  # a pipeline rank of Mamba layers only
        return zero_cell_tokens(page_size)
    if isinstance(cell.total, int):
        tokens = available_bytes // cell.total
    else:
        tokens = int(available_bytes // cell.total)
    return floor_page(tokens, page_size)


def cap_max_total_tokens(settings: SGLangSettings, tokens: int, page_size: int) -> int:
    """`--max-total-tokens` caps the token count (a larger value is ignored); the capped count
    is floored to a page again."""
    cap = settings.max_total_tokens
    if cap is None or cap >= tokens:
        return tokens
    return floor_page(cap, page_size)


def swa_tokens(full_tokens: int, ratio: float, page_size: int) -> int:
    """Tokens of the window pool: int(full tokens * ratio), floored to a page."""
    return floor_page(int(full_tokens * ratio), page_size)


def validate_swa_pool(swa: int, window: int, page_size: int) -> None:
    """SGLang refuses a window pool that cannot admit one request: a prefill holds its window
    plus a page, so the pool must have more tokens than window + page_size."""
    if window + page_size >= swa:
        raise CapacityError(
            f"engine.swa_full_tokens_ratio: the window pool cannot hold one request; expected "
            f"more than sliding_window + page_size = {window + page_size} tokens, got {swa} "
            "(raise swa_full_tokens_ratio or the budget)",
            field="engine.swa_full_tokens_ratio",
        )


def refuse_empty_pool(tokens: int, page_size: int) -> None:
    """A budget below one page (beside the padding page) leaves SGLang no token to hand out."""
    if tokens <= 0:
        raise CapacityError(
            f"device.available_bytes: the KV budget holds no page; expected at least one page "
            f"of {page_size} tokens, got {tokens} tokens",
            field="device.available_bytes",
        )


def max_running_requests(
    settings: SGLangSettings, token_capacity: int, mamba_slots: int | None,
    strategy_page: int | None,
) -> int:
    """Requests SGLang runs at once (also the request-to-token rows, less the padding row).
    Given: min(--max-running-requests // attention DP groups, tokens // 2); else SGLang's estimate
    int(tokens / context_length * 512) clamped to [2048, 4096], then min(., tokens // 2).
    Mamba hybrids: at most max_mamba_cache_size // the state slots one request may hold (5,
    1 with the radix cache off)."""
    estimated = int(token_capacity / settings.context_length * REQUESTS_PER_CONTEXT)
    estimated = max(min(estimated, MAX_ESTIMATED_REQUESTS), MIN_ESTIMATED_REQUESTS)
    given = settings.max_running_requests
    given = None if given is None else requests_per_worker(settings, given)
    requests = min(estimated if given is None else given, token_capacity // 2)
    if mamba_slots is not None:
        requests = min(requests, mamba_slots // mamba_slots_per_request(settings, strategy_page))
    if requests <= 0:
        raise CapacityError(
            f"engine: SGLang would run no request; expected at least one, got {requests} "
            f"(tokens {token_capacity}, Mamba slots {mamba_slots})",
            field="engine.max_running_requests",
        )
    return requests


def req_to_token_shape(
    settings: SGLangSettings, requests: int, extra: int = REQ_TO_TOKEN_EXTRA
) -> tuple[int, int]:
    """SGLang's request-to-token table: int32 [requests + 1 (row 0 pads), context_length +
    `extra`] (4, more with speculative decoding: speculative.req_to_token_extra)."""
    rows, width = requests + 1, settings.context_length + extra
    refuse_table_past_int64(rows, width)
    return rows, width


def hisparse_host_tokens(device_tokens: int, ratio: int, page_size: int) -> int:
    """Tokens of HiSparse's pinned host pool: (device tokens * ratio // page + 1) pages."""
    return (device_tokens * ratio // page_size + 1) * page_size


def hisparse_logical_tokens(device_tokens: int, ratio: int) -> int:
    """Token ids HiSparse's allocator hands out (the index keys cover them all): the device
    tokens times host_to_device_ratio."""
    return device_tokens * ratio


def hisparse_hot_rows(device_buffer: int, page_size: int) -> int:
    """Device rows one request's hot buffer takes: its device buffer and a page."""
    return device_buffer + page_size
