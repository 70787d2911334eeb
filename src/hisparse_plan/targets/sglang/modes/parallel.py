"""SGLang's parallel and communication modes, as the sizing and default rules read them: DP
attention (`--enable-dp-attention --dp-size N`) and DeepEP's all-to-all
(`--moe-a2a-backend deepep`). One function per rule; the resolve stage's fraction rule
(memory_rule.py) and the size stage's request count (sizing.py) call them.

SGLang 0.5.23 turns `--dp-size N --enable-dp-attention` into `attn_dp_size = N`
(parallel_hook.handle_deprecated_dp_attention): N attention groups of tp_size / N ranks, each
with its own pools and requests. The layers a request carries are one attention rank's (heads
split over tp_size / N), so the pools need nothing more; what moves is below."""

from __future__ import annotations

from typing import Final

from hisparse_plan.models.sglang_settings import SGLangSettings

DP_GRAPH_MIB_PER_BATCH: Final = 3
"""MiB SGLang keeps per decode graph batch slot and attention DP group (padding)."""
DP_LARGE_BATCH: Final = 300
DP_LARGE_BATCH_MIB_PER_BATCH: Final = 1.5
"""... and 1.5 more per slot and group when the largest decode graph batch exceeds 300."""
DEEPEP_DECODE_MIB: Final = 2 * 1024
"""DeepEP's all-to-all buffers captured in the decode graphs."""
DEEPEP_PREFILL_MIB: Final = 1 * 1024
"""DeepEP's extra with (breakable, SGLang's CUDA default) prefill graphs."""


def attn_dp_size(settings: SGLangSettings) -> int:
    """Attention data-parallel groups: dp_size with `--enable-dp-attention`, else 1 (plain
    `--dp-size` replicas each size their pools as one server)."""
    return settings.dp_size if settings.enable_dp_attention else 1


def attn_tp_size(settings: SGLangSettings) -> int:
    """Ranks one attention group splits the heads over: tp_size / attn_dp_size."""
    return settings.tp_size // attn_dp_size(settings)


def requests_per_worker(settings: SGLangSettings, given: int) -> int:
    """A given `--max-running-requests` is the whole server's: each attention DP group runs
    given // attn_dp_size of them, at least one."""
    return max(1, given // attn_dp_size(settings))


def dp_attention_graph_mib(settings: SGLangSettings, decode_max_bs: int) -> float:
    """MiB the default fraction keeps back for DP attention's decode graphs: 3 per batch slot
    and group, 1.5 more when the largest batch exceeds 300 (memory_hook.reserve_for_graph_mb:
    with the decode graphs off too; nothing without DP attention)."""
    groups = attn_dp_size(settings)
    if groups <= 1:
        return 0.0
    reserve: float = decode_max_bs * groups * DP_GRAPH_MIB_PER_BATCH
    if decode_max_bs > DP_LARGE_BATCH:
        reserve += decode_max_bs * groups * DP_LARGE_BATCH_MIB_PER_BATCH
    return float(reserve)


def deepep_prefill_graph_mib(settings: SGLangSettings, *, prefill_graphs: bool) -> float:
    """DeepEP's bridge pool during prefill graph capture: 1 GiB with prefill graphs on."""
    if settings.moe_a2a_backend != "deepep" or not prefill_graphs:
        return 0.0
    return float(DEEPEP_PREFILL_MIB)


def deepep_a2a_mib(settings: SGLangSettings) -> float:
    """DeepEP's all-to-all buffers, kept on top of the 10 GiB floor: 2 GiB with decode graphs
    on (memory_hook.reserve_for_deepep_a2a_mb)."""
    if settings.moe_a2a_backend != "deepep" or settings.disable_decode_cuda_graph:
        return 0.0
    return float(DEEPEP_DECODE_MIB)
