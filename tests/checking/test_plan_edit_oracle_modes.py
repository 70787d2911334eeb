"""The SGLang plan-edit oracle's server modes (plan_edit_oracle_sglang_modes), so that it cannot
pass the fuzzer's mode seeds vacuously: the fuzzer seeds every mode, the oracle finds each seed
sound, and one hand edit of each mode's figures is a fault of the kind the oracle names."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest

from hisparse_plan.models.sglang_plan import SGLangPlan
from support.plan_edit_oracle_sglang import sglang_faults
from support.plan_edit_seeds import SGLANG_MODES, Seed, sglang_preset_seeds

Data = dict[str, Any]


@pytest.fixture(scope="module")
def seeds() -> dict[str, Seed]:
    found = sglang_preset_seeds(random.Random(0))
    return {seed.name.split(":")[0].removeprefix("sglang "): seed for seed in found}


def test_every_mode_is_seeded_and_sound(seeds: dict[str, Seed]) -> None:
    for mode, *_ in SGLANG_MODES:
        assert mode in seeds, f"no seed plan for {mode!r}"
        plan = seeds[mode].plan
        assert isinstance(plan, SGLangPlan)
        assert sglang_faults(plan) == [], mode


def _pool(data: Data, name: str) -> Data:
    pool: Data = next(p for p in data["pools"] if p["name"] == name)
    return pool


def _draft_price(data: Data) -> None:
    """The draft a byte dearer, the cell too: the cell still sums, the price is wrong."""
    data["speculative"]["draft_cell_size_bytes"] += 1
    data["budget"]["cell_size_bytes"] += 1


def _draft_on_rank_0(data: Data) -> None:
    """The target's kv pool and tensor copied as a draft pool of the draft's layers."""
    data["pools"].append(_pool(data, "kv") | {"name": "draft_kv"})
    kv = next(t for t in data["tensors"] if t["pool"] == "kv")
    data["tensors"].append(kv | {"pool": "draft_kv",
                                 "layers": data["speculative"]["draft_layers"]})


def _swap_placeholder(data: Data) -> None:
    data["index_placeholder_layers"][-1] = "model.layers.0.self_attn.attn"


def _own_tokens(data: Data) -> None:
    rank = data["pipeline"]["pp_rank"]
    data["pipeline"]["stage_tokens"][rank] += data["page_size"]


def _metadata_bytes(data: Data) -> None:
    data["hisparse"]["metadata"][0]["nbytes"] += 1


def _drop_miss_count(data: Data) -> None:
    data["hisparse"]["metadata"] = [b for b in data["hisparse"]["metadata"]
                                    if b["name"] != "_miss_count"]


def _no_context(data: Data) -> None:
    """The request table only as wide as SGLang's extra columns (no context left)."""
    page, spec = data["page_size"], data["speculative"]
    pages = -(-(page - 1 + spec["num_steps"]) // page) + (page - 1) // page
    width = max(4 + spec["num_draft_tokens"],
                2 * max(pages * page * spec["eagle_topk"], spec["num_draft_tokens"]) + page - 1)
    data["req_to_token"]["shape"][1] = width
    data["req_to_token"]["strides"][0] = width


EDITS: list[tuple[str, Callable[[Data], None], str]] = [
    ("DP attention with a draft", lambda d: _pool(d, "draft_kv").update(
        num_blocks=_pool(d, "draft_kv")["num_blocks"] + 1), "draft tokens"),
    ("speculative MTP with decode context parallelism", _draft_price, "draft price"),
    ("speculative MTP with HiSparse", lambda d: d["speculative"].update(
        draft_layers=["draft.layers.7"]), "draft layers"),
    ("speculative EAGLE, V apart (draft_kv_v)", _no_context, "req_to_token"),
    ("speculative EAGLE, Mamba intermediates (chain)", lambda d: _pool(
        d, "mamba_intermediate_ssm").update(num_blocks=1), "mamba intermediates"),
    ("pipeline rank without the draft worker", _draft_on_rank_0, "speculative pools"),
    ("pipeline rank", lambda d: d["pipeline"].update(stage_layers=[3, 1]), "pipeline split"),
    ("pipeline rank", lambda d: d["pipeline"].update(start_layer=1), "pipeline start"),
    ("pipeline rank", _own_tokens, "pipeline tokens"),
    ("pipeline rank of window layers only", lambda d: d["budget"].update(
        cell_size_bytes=d["budget"]["cell_size_bytes"] + 1), "window-only rank"),
    ("radix off, one Mamba slot a request", lambda d: d["budget"].update(
        mamba_slots_per_request=5), "mamba slots"),
    ("radix off, request-capped window pool", lambda d: d["budget"].update(
        available_bytes=d["budget"]["available_bytes"] // 2), "budget"),
    ("decode context parallelism", lambda d: _pool(d, "index").update(
        num_blocks=_pool(d, "kv")["num_blocks"]), "index tokens"),
    ("hisparse metadata", _metadata_bytes, "hisparse metadata"),
    ("hisparse metadata, shared-index miss plan", _drop_miss_count, "hisparse metadata"),
    ("shared-index placeholders", _swap_placeholder, "index placeholders"),
    ("speculative EAGLE, a draft wider than the target", lambda d: d["speculative"].pop(
        "draft_beyond_budget_bytes"), "draft past the budget"),
    ("speculative EAGLE, a narrower draft of its own head_dim", lambda d: d["speculative"].update(
        draft_beyond_budget_bytes=4096), "draft past the budget"),
]


@pytest.mark.parametrize(("mode", "change", "kind"), EDITS,
                         ids=[f"{mode} | {kind}" for mode, _, kind in EDITS])
def test_the_oracle_finds(seeds: dict[str, Seed], mode: str, change: Callable[[Data], None],
                          kind: str) -> None:
    data = seeds[mode].plan.model_dump(mode="json")
    change(data)
    faults = sglang_faults(SGLangPlan.model_validate(data))
    assert kind in [fault.kind for fault in faults], faults
