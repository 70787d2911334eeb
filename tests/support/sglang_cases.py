"""Tiny SGLang plans of every pool kind, planned by the SGLang target itself, for the tests of
check_plan's views and figures and of verify; this module holds no tests itself."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from hisparse_plan.models.request import PlanRequest
from hisparse_plan.models.sglang_plan import SGLangPlan
from hisparse_plan.presets import Settings, build_request, load_preset
from hisparse_plan.targets.sglang import plan_sglang
from support.sglang_requests import dsa_layers, latent, mha, request, swa

MIB = 2**20


def tiny_mamba() -> dict[str, Any]:
    """A Mamba layer with states of a few hundred bytes."""
    return {"kind": "mamba", "block_size": 64, "state_shapes": [[3, 16], [2, 4, 8]],
            "state_dtypes": ["bfloat16", "bfloat16"]}


def v4_request(layers: int = 4, **engine: Any) -> PlanRequest:
    """DeepSeek-V4-Flash's first `layers` decoder layers (two window-only, then c4 and c128
    alternately, so four hold every V4 pool) with small pools: one running request, 1024
    tokens, half of them in the window pool."""
    arch = load_preset("deepseek-v4-flash").architecture
    data = build_request(arch, Settings(max_model_len=1024)).model_dump(mode="json")
    data["layers"] = {name: spec for name, spec in data["layers"].items()
                      if int(re.findall(r"layers\.(\d+)\.", name)[0]) < layers}
    data["device"]["available_bytes"] = 64 * MIB
    data["engine"] = {"name": "sglang", "context_length": 1024, "max_running_requests": 1,
                      "swa_full_tokens_ratio": 0.5, "max_total_tokens": 1024, **engine}
    return PlanRequest.model_validate(data)


TINY: dict[str, Callable[[], PlanRequest]] = {
    "mha": lambda: request({"a": mha(heads=2, head=8), "b": mha(heads=2, head=8)},
                           page_size=4, max_total_tokens=32, context_length=16),
    "mha_page_1": lambda: request({"a": mha(heads=2, head=8)}, max_total_tokens=24,
                                  context_length=8),
    "k_and_v_apart": lambda: request({"a": mha(heads=2, head=8, head_size_v=4)}, page_size=4,
                                     max_total_tokens=30, context_length=8),
    "window": lambda: request({"w0": swa(16, heads=2, head=8), "f1": mha(heads=2, head=8)},
                              page_size=4, max_total_tokens=64, swa_full_tokens_ratio=0.5,
                              context_length=16),
    "mla": lambda: request({"a": latent(), "b": latent()}, page_size=64, max_total_tokens=128,
                           context_length=64),
    "dsa": lambda: request(dsa_layers(2), max_total_tokens=128, context_length=64),
    "dsa_hisparse": lambda: request(dsa_layers(2), max_total_tokens=128, context_length=64,
                                    enable_hisparse=True, hisparse_top_k=64),
    "mamba": lambda: request({"m0": tiny_mamba(), "a1": mha(heads=2, head=8),
                              "m2": tiny_mamba()}, max_mamba_cache_size=6,
                             max_total_tokens=32, context_length=8),
    "deepseek_v4": v4_request,
    "deepseek_v4_hisparse": lambda: v4_request(enable_hisparse=True,
                                               hisparse_host_to_device_ratio=2),
    "deepseek_v4_pipeline_rank": lambda: v4_request(pp_size=2, pp_rank=0),
    "deepseek_v4_hisparse_pipeline_rank": lambda: v4_request(
        6, pp_size=2, pp_rank=1, enable_hisparse=True, hisparse_host_to_device_ratio=2),
    "window_draft": lambda: request(
        {"w0": swa(16, heads=2, head=8), "f1": mha(heads=2, head=8)}, page_size=4,
        max_total_tokens=64, swa_full_tokens_ratio=0.5, context_length=16,
        speculative_algorithm="EAGLE", speculative_draft_num_layers=2,
        speculative_draft_window_layers=1, speculative_draft_window_layer_ids=[0]),
    "capped_window": lambda: request(
        {"w0": swa(16, heads=2, head=8), "f1": mha(heads=2, head=8)}, page_size=4,
        max_total_tokens=30, context_length=16, disable_radix_cache=True,
        max_running_requests=1, chunked_prefill_size=8),
    "pipeline_rank": lambda: request(
        {f"model.layers.{i}.self_attn.attn": mha(heads=2, head=8) for i in range(3)},
        page_size=4, max_total_tokens=32, context_length=16, pp_size=2, pp_rank=1),
}
"""Every kind of SGLang pool: MHA (K and V fused, or apart), window, MLA, DSA, DSA with
HiSparse's host pool, a Mamba hybrid, DeepSeek-V4's seven pools (and HiSparse's paged c4 host
pool beside them), a window model drafting with a window layer (draft_kv and draft_swa), a
window pool capped at an unaligned max_total_tokens with the radix cache off (its K half's
spare rows between its last page and V's first), and
one pipeline rank's (DeepSeek-V4's too: a rank of window layers only, whose compressed pools
SGLang keeps empty, and a rank with HiSparse)."""

_PLANS: dict[str, SGLangPlan] = {}


def tiny_plan(case: str) -> SGLangPlan:
    """The SGLang target's plan of TINY[case] (planned once per session: plans are frozen)."""
    if case not in _PLANS:
        _PLANS[case] = plan_sglang(TINY[case]())
    return _PLANS[case]


def tiny_dump(case: str) -> dict[str, Any]:
    """The plan of TINY[case] as JSON-shaped data, a fresh copy to edit."""
    return tiny_plan(case).model_dump(mode="json")
