"""Cross-layer KV sharing (issue 27 item 2): a layer that reads another layer's cache gets no
pages; the plan says whose pages it reads; check_plan allows that aliasing and no other; the
torch backend binds the target's tensor to it; Gemma-3n plans as vLLM 0.34 allocates it.

Figures are worked out by hand from tests/hf_configs/gemma-3n-e4b-it/config.json: 35 layers,
the last 15 (num_kv_shared_layers) reading layer 18 (sliding) or 19 (full); layer_types four
sliding then one full; 2 KV heads of 256, bfloat16, window 512, vLLM 0.34's block of 64 tokens.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from pydantic import ValidationError

import hisparse_plan as hp
from hisparse_plan.exchange.transfer import (
    TransferRequest,
    build_transfer,
    check_transfer,
    tables,
)
from hisparse_plan.presets import Settings, build_request
from hisparse_plan.presets.config_file import load_config_file
from support import paths

GEMMA3N = paths.HF_CONFIGS / "gemma-3n-e4b-it" / "config.json"
PREFIX = "language_model.model.layers"


def name(i: int) -> str:
    return f"{PREFIX}.{i}.self_attn.attn"


def gemma3n(**given: Any) -> hp.PlanRequest:
    arch = load_config_file(GEMMA3N, use_transformers=False)
    return build_request(arch, Settings(max_model_len=4096, **given))


def small_request(**device: Any) -> dict[str, Any]:
    """Seven layers: two sliding and two full that keep caches (two groups of two), then
    sliding l4 and l6 reading l1 and full l5 reading l3."""
    def layer(kind: str, target: str | None = None) -> dict[str, Any]:
        spec: dict[str, Any] = {"kind": kind, "block_size": 16, "num_kv_heads": 2,
                                "head_size": 64}
        if kind == "sliding_window":
            spec["sliding_window"] = 256
        if target is not None:
            spec["kv_sharing_target"] = target
        return spec

    sliding, full = "sliding_window", "full_attention"
    return {
        "layers": {"l0": layer(sliding), "l1": layer(sliding), "l2": layer(full),
                   "l3": layer(full), "l4": layer(sliding, "l1"), "l5": layer(full, "l3"),
                   "l6": layer(sliding, "l1")},
        "model": {"max_model_len": 2048},
        "device": {"available_bytes": 16 * 2**20, **device},
    }


# -- the request ------------------------------------------------------------------------------


@pytest.mark.parametrize(("edit", "message"), [
    ({"kv_sharing_target": "l9"}, r"layers\['l4'\].kv_sharing_target: expected a layer of the "
                                  r"request, got 'l9'"),
    ({"kv_sharing_target": "l4"}, r"layers\['l4'\].kv_sharing_target: a layer cannot read its "
                                  "own cache"),
    ({"kv_sharing_target": "l6"}, r"'l6' itself reads 'l1''s cache"),
    ({"sliding_window": 512}, r"'l1' has sliding_window 256, this layer 512"),
    ({"kind": "full_attention", "sliding_window": None},
     r"layers\['l4'\].kv_sharing_target: 'l1' has"),
])
def test_a_declaration_the_request_cannot_keep_names_the_layer(
    edit: dict[str, Any], message: str,
) -> None:
    request = small_request()
    layer = {**request["layers"]["l4"], **edit}
    request["layers"]["l4"] = {k: v for k, v in layer.items() if v is not None}
    with pytest.raises(ValidationError, match=message):
        hp.PlanRequest.model_validate(request)


def test_requests_and_plans_without_sharing_dump_as_before() -> None:
    request = small_request()
    for layer in request["layers"].values():
        layer.pop("kv_sharing_target", None)
    plain = hp.PlanRequest.model_validate(request)
    assert "kv_sharing_target" not in json.dumps(plain.model_dump(mode="json"))
    assert "kv_sharing" not in hp.plan(plain).model_dump(mode="json")


# -- the plan ---------------------------------------------------------------------------------


def test_gemma3n_allocates_20_layers_as_vllm_does() -> None:
    """20 allocating layers, 16 sliding and 4 full: vLLM groups them 4 a group, five groups.
    One page is 64 tokens x 2 heads x (256 + 256) x 2 bytes = 131,072 bytes, a block of the
    pool 4 x 131,072 = 524,288 bytes; 8 GiB hold 16,384 blocks. A 4096-token request takes
    64 full blocks, and each sliding group min(512 - 1 + 8192 batched tokens, 4096) / 64 + 1
    = 65 (vLLM's window rule) = 324 blocks: 16,384 / 324 = 50.57 requests."""
    request = gemma3n(gpu_mem_bytes=8 * 2**30)
    plan = hp.plan(request)
    kinds = [(group.spec.kind, len(group.layer_names)) for group in plan.groups]
    assert kinds == [("sliding_window", 4)] * 4 + [("full_attention", 4)]
    allocated = {layer for group in plan.groups for layer in group.layer_names}
    assert allocated == {name(i) for i in range(20)}
    assert plan.kv_sharing == {name(i): name(18 if i % 5 != 4 else 19) for i in range(20, 35)}
    assert plan.device_pool.bytes_per_block == 4 * 64 * 2 * 512 * 2 == 524_288
    assert plan.num_blocks == 8 * 2**30 // 524_288
    assert plan.capacity.max_concurrency == pytest.approx(16_384 / (64 + 4 * 65))
    hp.check_plan(plan, request=request)


def test_the_plan_is_the_plan_of_its_allocating_layers() -> None:
    """Sharing changes nothing of the allocating layers' plan but the record of who reads
    whose pages."""
    shared = hp.plan(small_request())
    alone = small_request()
    for layer in ("l4", "l5", "l6"):
        del alone["layers"][layer]
    plain = hp.plan(alone).model_dump(mode="json")
    dumped = shared.model_dump(mode="json")
    assert dumped.pop("kv_sharing") == {"l4": "l1", "l5": "l3", "l6": "l1"}
    assert dumped == plain
    assert hp.KVCachePlan.model_validate_json(shared.model_dump_json()) == shared
    assert shared.fingerprint != hp.plan(alone).fingerprint


def stages(*layers: list[str]) -> dict[str, Any]:
    return small_request(available_bytes=0, pipeline_stages=[
        {"layers": names, "available_bytes": 2**23} for names in layers])


def test_sharing_across_pipeline_stages_or_with_hisparse_is_refused() -> None:
    with pytest.raises(hp.PlanError, match=r"stages\[1\].layers: 'l5' reads 'l3''s cache, "
                                           "which stage 0 holds"):
        hp.plan(stages(["l0", "l1", "l2", "l3", "l4"], ["l5", "l6"]))
    with pytest.raises(hp.PlanError, match=r"stages\[1\].layers: 'l6' reads 'l1''s cache"):
        hp.plan(stages(["l0", "l1", "l2", "l3", "l4", "l5"], ["l6"]))
    with pytest.raises(hp.PlanError, match=r"HiSparse beside cross-layer KV sharing"):
        hp.plan({**small_request(), "hisparse": {"host_pool_gib": 1.0},
                 "model": {"max_model_len": 2048, "index_topk": 64}})


def test_stages_keep_the_sharing_layer_with_its_target() -> None:
    request = stages(["l0", "l1", "l4", "l6"], ["l2", "l3", "l5"])
    plan = hp.plan(request)
    assert [pool.layers for pool in plan.device_pools] == [["l0", "l1"], ["l2", "l3"]]
    hp.check_plan(plan, request=request)


# -- check_plan -------------------------------------------------------------------------------


def dumped() -> tuple[dict[str, Any], hp.PlanRequest]:
    request = hp.PlanRequest.model_validate(small_request())
    return hp.plan(request).model_dump(mode="json"), request


def tensor_of(plan: dict[str, Any], layer: str) -> int:
    return next(i for i, t in enumerate(plan["tensors"]) if layer in t["layers"])


def group_of(plan: dict[str, Any], layer: str) -> int:
    return next(i for i, g in enumerate(plan["groups"]) if layer in g["layer_names"])


def _l1_on_l0s_pages_in_its_own_tensor(plan: dict[str, Any]) -> None:
    """l0 and l1 (one group, one tensor) split into two tensors that both start at l0's
    pages: l1 reads and writes l0's bytes, and nothing declares it."""
    index = tensor_of(plan, "l0")
    tensor = plan["tensors"][index]
    assert tensor["layers"] == ["l0", "l1"]
    plan["tensors"][index:index + 1] = [{**tensor, "layers": ["l0"]},
                                        {**tensor, "layers": ["l1"]}]


def _l1_on_l0s_pages_in_one_tensor(plan: dict[str, Any]) -> None:
    """The same, by a layer stride of 0 in their one tensor."""
    plan["tensors"][tensor_of(plan, "l0")]["layer_stride"] = 0


def _target_not_placed(plan: dict[str, Any]) -> None:
    plan["kv_sharing"]["l4"] = "l9"


def _target_itself_shares(plan: dict[str, Any]) -> None:
    plan["kv_sharing"]["l4"] = "l6"


def _sharing_layer_in_a_group(plan: dict[str, Any]) -> None:
    plan["kv_sharing"]["l0"] = "l1"


def _group_spec_declares_sharing(plan: dict[str, Any]) -> None:
    plan["groups"][group_of(plan, "l1")]["spec"]["kv_sharing_target"] = "l0"


@pytest.mark.parametrize(("tamper", "expect"), [
    (_l1_on_l0s_pages_in_its_own_tensor, r"'l1'.*'l0'|'l0'.*'l1'"),
    (_l1_on_l0s_pages_in_one_tensor, r"'l1'.*'l0'|'l0'.*'l1'"),
    (_target_not_placed, r"kv_sharing\['l4'\] names 'l9', which no group lists"),
    (_target_itself_shares, r"names 'l6', which itself reads 'l1''s pages"),
    (_sharing_layer_in_a_group, r"kv_sharing\['l0'\]: 'l0' reads 'l1''s pages, but groups"),
    (_group_spec_declares_sharing, r"groups\[\d\] gives layer 'l\d' a spec with "
                                   "kv_sharing_target 'l0'"),
])
def test_aliasing_other_than_the_declared_is_refused(tamper: Any, expect: str) -> None:
    plan, _ = dumped()
    hp.check_plan(plan)
    tamper(plan)
    with pytest.raises(hp.PlanInvariantError, match=expect):
        hp.check_plan(plan)


def test_a_target_of_another_geometry_is_refused_against_the_request() -> None:
    """Without the request a plan cannot tell l4's kind; with it, retargeting l4 (sliding)
    to l3 (full) is refused by the kind, and a dropped declaration by name."""
    plan, request = dumped()
    retargeted = copy.deepcopy(plan)
    retargeted["kv_sharing"]["l4"] = "l3"
    hp.check_plan(retargeted)  # sound as a layout: l3's pages exist
    with pytest.raises(hp.PlanInvariantError,
                       match=r"names 'l3', whose pages have kind 'full_attention'; the request's "
                             r"'l4' has 'sliding_window'"):
        hp.check_plan(retargeted, request=request)
    del plan["kv_sharing"]["l5"]
    with pytest.raises(hp.PlanInvariantError, match=r"'l5' reads 'l3''s cache; expected "
                                                    r"kv_sharing\['l5'\]"):
        hp.check_plan(plan, request=request)


# -- the torch backend ------------------------------------------------------------------------


def test_a_plan_with_shared_layers_allocates_and_verifies_on_cpu() -> None:
    torch = pytest.importorskip("torch")
    from hisparse_plan.torch import allocate, meta_check, verify

    plan = hp.plan(small_request())
    with allocate(plan, device="cpu", pin=False) as pools:
        report = verify(plan, pools)
        assert (report.layers, report.groups) == (4, 2)
        views = pools.views()
        assert list(views) == [f"l{i}" for i in range(7)]
        assert views["l4"] is views["l1"]
        assert views["l6"] is views["l1"]
        assert views["l5"] is views["l3"]
        views["l2"].zero_()
        one = pools.view("l5")
        assert one.data_ptr() == views["l3"].data_ptr()
        assert one.shape == views["l3"].shape
        one.fill_(7)
        assert bool(torch.all(views["l3"] == 7))
        assert not bool(torch.any(views["l2"] == 7))
    assert meta_check(plan).layers == 7


# -- transfer ---------------------------------------------------------------------------------


def blocks_of(plan: hp.KVCachePlan) -> dict[str, list[int]]:
    """Two blocks a table, touching the next table's run: the groups share one pool, so the
    runs are adjacent bytes, and a row must still stay within one table."""
    return {table: [1 + 2 * i, 2 + 2 * i] for i, table in enumerate(tables(plan))}


def test_a_transfer_moves_only_the_targets_pages() -> None:
    plan = hp.plan(small_request())
    blocks = blocks_of(plan)
    program = build_transfer(plan, plan, TransferRequest(
        num_tokens=32, source_blocks=blocks, destination_blocks=blocks))
    assert program.layers == ["l0", "l1", "l2", "l3"]
    check_transfer(program, plan, plan)
    alone = small_request()
    for layer in alone["layers"].values():
        layer.pop("kv_sharing_target", None)
    unshared = hp.plan(alone)
    with pytest.raises(hp.PlanError, match=r"layer 'l4': kv_sharing_target differs: the source "
                                           "has l1, the destination has None"):
        build_transfer(plan, unshared, TransferRequest(
            num_tokens=32, source_blocks=blocks, destination_blocks=blocks_of(unshared)))


# -- the vLLM adapter, without vLLM ------------------------------------------------------------


def test_vllms_sharing_pairs_are_read_and_enter_the_request() -> None:
    from types import SimpleNamespace

    from hisparse_plan.adapters.vllm.kv_sharing import shared_kv_cache_layers, with_shared_layers

    def attention(target: str | None) -> SimpleNamespace:
        return SimpleNamespace(kv_sharing_target_layer_name=target)

    context = {"a": attention(None), "b": attention(None), "c": attention("a")}
    config = SimpleNamespace(compilation_config=SimpleNamespace(static_forward_context=context))
    assert shared_kv_cache_layers(config) == {"c": "a"}
    assert shared_kv_cache_layers(SimpleNamespace()) == {}
    layers: dict[str, dict[str, object]] = {"a": {"kind": "full_attention"},
                                            "b": {"kind": "sliding_window"}}
    assert with_shared_layers(layers, {"c": "a"})["c"] == {"kind": "full_attention",
                                                          "kv_sharing_target": "a"}
    with pytest.raises(hp.PlanError, match=r"'c' reads 'x''s cache, but 'x' has no KVCacheSpec"):
        with_shared_layers(layers, {"c": "x"})
    with pytest.raises(hp.PlanError, match=r"'b' reads 'a''s cache, but 'b' has a KVCacheSpec"):
        with_shared_layers(layers, {"b": "a"})


def test_a_meta_build_that_shares_otherwise_is_refused_naming_the_layer() -> None:
    from hisparse_plan.adapters.vllm.meta_model import MetaModel, check_layers_agree

    request = gemma3n()
    meta = MetaModel({}, "Gemma3nForConditionalGeneration", "0.34.0",
                     shared={name(20): name(19)})
    with pytest.raises(hp.PlanError, match=rf"layers\['{name(20)}'\].kv_sharing_target: vLLM "
                                           rf"0.34.0's .* reads the cache of '{name(19)}', "
                                           rf"the config reading '{name(18)}'"):
        check_layers_agree(request.layers, meta)


def test_the_manifest_lists_placed_layers_and_names_the_sharing() -> None:
    from hisparse_plan.exchange import manifest

    plan = hp.plan(small_request())
    found = manifest(plan)
    assert [entry.name for entry in found.layers] == ["l0", "l1", "l2", "l3"]
    assert found.kv_sharing == {"l4": "l1", "l5": "l3", "l6": "l1"}
    alone = small_request()
    for layer in ("l4", "l5", "l6"):
        del alone["layers"][layer]
    assert "kv_sharing" not in manifest(hp.plan(alone)).model_dump(mode="json")


def test_gemma3n_allocates_and_verifies_on_cpu() -> None:
    """The whole model, small: 32 MiB of 524,288-byte blocks is 64 blocks; 35 views bound, 20
    with pages of their own."""
    pytest.importorskip("torch")
    from hisparse_plan.torch import allocate, meta_check, verify

    arch = load_config_file(GEMMA3N, use_transformers=False)
    request = build_request(arch, Settings(max_model_len=256, gpu_mem_bytes=32 * 2**20))
    plan = hp.plan(request)
    hp.check_plan(plan, request=request)
    assert plan.num_blocks == 64
    with allocate(plan, device="cpu", pin=False) as pools:
        assert verify(plan, pools).layers == 20
        views = pools.views()
        assert len(views) == 35
        assert all(views[layer] is views[target] for layer, target in plan.kv_sharing.items())
    assert meta_check(plan).layers == 35


def test_gemma3n_from_vllm_to_sglang_is_refused_naming_a_shared_layer() -> None:
    """SGLang keeps a buffer of its own for each sharing layer, which vLLM's plan has no pages
    to fill from."""
    from hisparse_plan.adapters.sglang import request_from_server_args
    from hisparse_plan.targets import plan_for_engine

    vllm = hp.plan(gemma3n(gpu_mem_bytes=2**30))
    sglang = plan_for_engine(request_from_server_args(
        str(GEMMA3N), {"tp_size": 1, "context_length": 4096}, {"available_bytes": 2**30}))
    request = TransferRequest(num_tokens=64, source_blocks=blocks_of(vllm),
                              destination_blocks={table: list(range(1, 65))
                                                  for table in tables(sglang)})
    with pytest.raises(hp.PlanError, match=rf"layer '{name(20)}': kv_sharing_target differs"):
        build_transfer(vllm, sglang, request)
