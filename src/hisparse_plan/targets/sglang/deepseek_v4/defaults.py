"""SGLang's server defaults for DeepSeek-V4 (its model override and hooks), one function each,
the resolve stage's (resolve.py): the page size, the window pool's ratio, the requests the
state rings are budgeted for, and mem_fraction_static."""

from __future__ import annotations

from typing import Final

from hisparse_plan.models.sglang_settings import SGLangSettings
from hisparse_plan.targets.sglang.memory_rule import default_mem_fraction_static
from hisparse_plan.targets.sglang.modes.parallel import requests_per_worker

V4_PAGE_SIZE: Final = 256
"""The page size SGLang's DeepSeek-V4 model override sets on CUDA, over any given."""
V4_SWA_RATIO: Final = 0.1
"""swa_full_tokens_ratio SGLang's DeepSeek-V4 override sets when none is given."""
V4_MAX_RUNNING_REQUESTS: Final = 256
"""max_running_requests SGLang's DeepSeek-V4 hook sets when none is given."""


def v4_page_size(settings: SGLangSettings) -> int:
    """Tokens per page: 256 whatever `--page-size` says. SGLang's DeepSeek-V4 model override
    sets page_size to 256 on CUDA over any given one (arg_groups/model_overrides/deepseek_v4.py,
    _deepseek_v4_overrides), so a given 64 or 512 is served on 256-token pages."""
    del settings  # the given page size does not reach SGLang's V4 pools
    return V4_PAGE_SIZE


def v4_swa_ratio(settings: SGLangSettings) -> float:
    """Window-pool tokens per full token: the given ratio, else DeepSeek-V4's 0.1. SGLang
    records the override as explicitly set, so the window pool is always sized by ratio (never
    by its request-cap mode)."""
    ratio = settings.swa_full_tokens_ratio
    return V4_SWA_RATIO if ratio is None else ratio


def v4_requested_requests(settings: SGLangSettings) -> int:
    """Requests SGLang budgets the c128 state rings for: the given --max-running-requests,
    else the 256 DeepSeek-V4's hook sets (never SGLang's 2048..4096 estimate), set as the
    server's, so shared by the attention DP groups."""
    given = settings.max_running_requests
    return requests_per_worker(settings, V4_MAX_RUNNING_REQUESTS if given is None else given)


def v4_static_fraction(settings: SGLangSettings) -> float | None:
    """The mem_fraction_static for DeepSeek-V4: the given one, else SGLang's default rule as
    it runs for V4 (no prefill graphs; the decode graphs sized before V4's hook sets its 256
    running requests), else unknown (null) without the GPU's total memory."""
    if settings.mem_fraction_static is not None:
        return settings.mem_fraction_static
    if settings.gpu_memory_bytes is None:
        return None
    return default_mem_fraction_static(settings, mla=True, deepseek_v4=True)
