"""check_plan's proofs for SGLang's modes that the plan-edit fuzzer found missing
(references/fuzz_plan_edits.py --engine sglang): each test edits the planner's own plan as the
fuzzer did and expects a refusal, after the unedited plan passes."""

from __future__ import annotations

import random
from typing import Any

import pytest

from hisparse_plan.checking import check_plan
from hisparse_plan.errors import PlanInvariantError
from hisparse_plan.models import PlanRequest
from hisparse_plan.models.sglang_plan import SGLangPlan
from hisparse_plan.targets import plan_for_engine
from support.plan_edit_seeds import sglang_seed


def seed_plan(model: str, decoders: set[int], settings: dict[str, Any],
              tweaks: dict[str, int] | None = None) -> dict[str, Any]:
    seed = sglang_seed("test", model, decoders, settings, tweaks or {}, random.Random(0))
    assert seed is not None
    assert isinstance(seed.plan, SGLangPlan)
    check_plan(seed.plan)
    return seed.plan.model_dump(mode="json")


def refused(data: dict[str, Any], match: str) -> None:
    with pytest.raises(PlanInvariantError, match=match):
        check_plan(SGLangPlan.model_validate(data))


@pytest.fixture(scope="module")
def shared_index() -> dict[str, Any]:
    """GLM-5-style shared index over decoder layers 0-4: index keys of layers 0 and 4,
    placeholders for 1, 2 and 3."""
    plan = seed_plan("glm-5-index-share-4", {0, 1, 2, 3, 4}, {})
    assert plan["index_placeholder_layers"] == [
        f"model.layers.{k}.self_attn.attn" for k in (1, 2, 3)]
    return plan


def test_a_placeholder_for_a_layer_with_index_keys_is_refused(
        shared_index: dict[str, Any]) -> None:
    """Placeholders 1, 2, 0: as many index buffers as latent layers, but layer 0 has two (its
    keys and a placeholder) and layer 3 none."""
    data = {**shared_index, "index_placeholder_layers": [
        f"model.layers.{k}.self_attn.attn" for k in (1, 2, 0)]}
    refused(data, "layer id 0 has 2 index buffers")


def test_an_index_layer_of_no_decoder_layer_is_refused(shared_index: dict[str, Any]) -> None:
    """Layer 4's index keys renamed 'device': which latent layer they index is lost."""
    data = SGLangPlan.model_validate(shared_index).model_dump(mode="json")
    index = next(t for t in data["tensors"] if t["pool"] == "index")
    index["layers"] = [("device" if "layers.4." in name else name) for name in index["layers"]]
    refused(data, "has no layer id")


def test_a_latent_layer_of_another_decoder_layer_is_refused(
        shared_index: dict[str, Any]) -> None:
    """Latent layer 4 renamed to a layer 5 that has neither index keys nor a placeholder."""
    data = SGLangPlan.model_validate(shared_index).model_dump(mode="json")
    latent = next(t for t in data["tensors"] if t["pool"] == "kv")
    latent["layers"] = [name.replace("layers.4.", "layers.5.") for name in latent["layers"]]
    refused(data, "layer id 4 has 1 index buffers .* and 0 latent layers")


def test_a_window_only_rank_sized_for_requests_is_refused() -> None:
    """Llama-4's rank 0 of two (decoder layers 0 and 1, window layers only) is SGLang's
    all-window pool; a request-sized window pool there is a figure SGLang never has."""
    plan = seed_plan("llama-4-scout", {0, 1, 2, 3}, {"pp_size": 2, "pp_rank": 0},
                     {"window": 16})
    assert [pool["name"] for pool in plan["pools"]] == ["swa"]
    plan["budget"]["swa_sized_for_requests"] = True
    refused(plan, "swa_sized_for_requests is true in a plan without a full pool")


def test_a_shared_index_of_names_without_layer_ids_is_paired_by_count() -> None:
    """A request's own layer names (no `layers.K`, no number): the planner's plan passes, the
    index buffers paired with the latent layers by count alone."""
    arch_names = {0: "a", 1: "b", 2: "c", 3: "d", 4: "e"}
    seed = sglang_seed("test", "glm-5-index-share-4", {0, 1, 2, 3, 4}, {}, {},
                       random.Random(0))
    assert seed is not None
    data = seed.request.model_dump(mode="json")

    def renamed(name: str) -> str:
        for k, letter in arch_names.items():
            name = name.replace(f"model.layers.{k}.", f"block_{letter}.")
        return name

    data["layers"] = {renamed(name): spec for name, spec in data["layers"].items()}
    plan = plan_for_engine(PlanRequest.model_validate(data))
    assert isinstance(plan, SGLangPlan)
    assert plan.index_placeholder_layers == ["block_b.self_attn.attn", "block_c.self_attn.attn",
                                             "block_d.self_attn.attn"]
    check_plan(plan)


def test_a_draft_tree_on_dsa_pages_is_refused() -> None:
    """DeepSeek-V3.2 with MTP, top-k edited to 2 and the request table widened by the tree's
    extra columns (so the context, and with it the capacity, stays): SGLang's dsa backend runs
    no draft tree on 64-token pages."""
    plan = seed_plan("deepseek-v3.2", {0, 1},
                     {"speculative_algorithm": "NEXTN", "speculative_draft_num_layers": 1})
    spec, page = plan["speculative"], plan["page_size"]
    assert (spec["eagle_topk"], page) == (1, 64)
    chain = max(4 + spec["num_draft_tokens"], 2 * spec["num_draft_tokens"] + page - 1)
    branch = -(-(page - 1 + spec["num_steps"]) // page)
    tree = max(4 + spec["num_draft_tokens"],
               2 * max(branch * page * 2, spec["num_draft_tokens"]) + page - 1)
    width = plan["req_to_token"]["shape"][1] + tree - chain
    spec["eagle_topk"] = 2
    plan["req_to_token"].update(shape=[plan["req_to_token"]["shape"][0], width],
                                strides=[width, 1])
    refused(plan, "eagle_topk is 2 in a DSA plan")
