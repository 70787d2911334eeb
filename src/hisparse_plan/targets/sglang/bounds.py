"""Settings that would push a figure of an SGLang plan past what the plan can state: an int64
count of bytes or elements, a finite float. Each is refused naming the setting that drives the
figure, before the plan's own models would refuse the figure as a ValidationError about a
model the caller never wrote (docs/planning-rules.md#sglang-limits)."""

from __future__ import annotations

import math
from typing import Final

from hisparse_plan.errors import PlanError
from hisparse_plan.models.base import INT64_MAX
from hisparse_plan.models.sglang_settings import SGLangSettings

TABLE_ITEM_BYTES: Final = 4
"""The request-to-token table holds int32 token ids."""
INT32_IDS: Final = 2**31
"""Token ids an int32 entry of the request-to-token table can hold."""
LIMITS_DOC: Final = "docs/planning-rules.md#sglang-limits"


def refuse_past_int64(value: int, field: str, what: str) -> None:
    """`what` (a figure the plan states, `value` of it) must fit an int64."""
    if value > INT64_MAX:
        raise PlanError(
            f"{field}: {what} would be {value}, past int64 ({INT64_MAX}); expected a smaller "
            f"{field.rsplit('.', 1)[-1]} (see {LIMITS_DOC})",
            field=field,
        )


def budget_field(settings: SGLangSettings) -> str:
    """The setting the KV budget comes from: the free memory after the weights when SGLang's
    formula runs, else the budget given outright."""
    if settings.post_weights_free_bytes is not None:
        return "engine.post_weights_free_bytes"
    return "device.available_bytes"


def pools_built(page_size: int) -> str:
    """What is built from the budget: each pool holds the budget's tokens and a padding page,
    so a budget near int64 gives a pool past it (said with `built_for(budget_field(...), ...)`,
    as a pool's own model refuses the size)."""
    return (f"its pools (each the budget's tokens and a padding page of {page_size} tokens; "
            f"see {LIMITS_DOC})")


def refuse_budget_past_int64(available: int, settings: SGLangSettings) -> None:
    """SGLang's int(GB * 2**30) of a budget near int64 rounds up past it (a float has 53 bits)."""
    refuse_past_int64(available, budget_field(settings), "the KV budget in bytes")


def refuse_table_past_int64(rows: int, width: int) -> None:
    """The request-to-token table, int32 [rows, width], must fit int64 bytes; its width is
    context_length + 4 (the rows are at most half the pool's tokens)."""
    refuse_past_int64(rows * width * TABLE_ITEM_BYTES, "engine.context_length",
                      f"the request-to-token table's bytes (int32 [{rows}, {width}])")


def refuse_hot_rows_past_int64(settings: SGLangSettings, buffer: int, page_size: int) -> None:
    """A request's hot rows are its device buffer and a page."""
    field = ("engine.hisparse_top_k" if settings.hisparse_device_buffer_size is None
             else "engine.hisparse_device_buffer_size")
    refuse_past_int64(buffer + page_size, field,
                      f"a request's hot rows (device buffer {buffer} + page {page_size})")


def refuse_token_ids_past_int32(ids: int, field: str) -> None:
    """SGLang's request-to-token table holds int32 token ids: every id the pools hand out
    (`ids`, the padding page's included) must be one."""
    if ids > INT32_IDS:
        raise PlanError(
            f"{field}: SGLang's request-to-token table holds int32 token ids (below "
            f"{INT32_IDS}); the pools would hand out {ids}, padding page included; expected a "
            f"smaller {field.rsplit('.', 1)[-1]}, or engine.max_total_tokens to cap the tokens "
            f"(see {LIMITS_DOC})",
            field=field,
        )


def refuse_unbounded(value: float, field: str, what: str) -> None:
    """A float SGLang's formula computes overflowed to infinity (or NaN): nothing to size by."""
    if not math.isfinite(value):
        raise PlanError(
            f"{field}: {what} overflows a float ({value}); expected a smaller "
            f"{field.rsplit('.', 1)[-1]} (see {LIMITS_DOC})",
            field=field,
        )
