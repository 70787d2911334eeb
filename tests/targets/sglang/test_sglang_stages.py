"""The SGLang target as named stages (read, resolve, size, place, report): each stage on its own
input, the values they hand on, the trace they keep and `explain` renders, and the shape itself
(every rule called from one stage, stages in one direction)."""

from __future__ import annotations

import ast
import dataclasses
import json
from typing import Any

import pytest
from hypothesis import given, settings
from test_sglang_v4 import v4_request

from hisparse_plan.errors import PlanError
from hisparse_plan.models.request import PlanRequest
from hisparse_plan.operator import Explanation, explain
from hisparse_plan.rule_docs import rule_doc
from hisparse_plan.targets import registry
from hisparse_plan.targets.sglang import STAGE_TITLES, plan_sglang, plan_traced
from hisparse_plan.targets.sglang.place import place
from hisparse_plan.targets.sglang.read import Read, ReadV4, read
from hisparse_plan.targets.sglang.report import report
from hisparse_plan.targets.sglang.resolve import Defaults, DefaultsV4, resolve
from hisparse_plan.targets.sglang.size import Sized, SizedV4, size
from hisparse_plan.targets.trace import Trace
from support import paths
from support.cli_support import Run
from support.sglang_requests import dsa_layers, mha, request, small_requests, swa

GIB = 1 << 30
PACKAGE = paths.REPO / "src" / "hisparse_plan" / "targets" / "sglang"
STAGES = ("read", "resolve", "size", "place", "report")
RULE_MODULES = ("settings", "model", "deepseek_v4/model", "defaults", "deepseek_v4/defaults",
                "sizing", "deepseek_v4/sizing", "served/architectures", "platform",
                "served/multimodal", "layout", "capacity", "memory_rule")


def mha_request(**engine: Any) -> PlanRequest:
    """2 layers of 8 kv heads x 128, bf16: 2 x 8 x (128 + 128) x 2 = 8192 bytes a token."""
    return request({"a": mha(), "b": mha()}, available=GIB, page_size=16, **engine)


# --- each stage on its own input ---------------------------------------------------------


def test_read_sorts_layers_and_keeps_the_settings() -> None:
    req = request({"f": mha(), "w": swa(128)}, available=GIB)
    got = read(req, Trace())
    assert isinstance(got, Read)
    assert got.settings is req.engine
    assert got.available_bytes == GIB
    assert got.model.full is not None
    assert got.model.full.names == ("f",)
    assert got.model.swa is not None
    assert got.model.swa.window == 128
    assert isinstance(read(v4_request(GIB, mem_fraction_static=0.9), Trace()), ReadV4)


def test_read_refuses_a_vllm_request_before_any_layer() -> None:
    vllm = PlanRequest.model_validate({"layers": {"a": {"kind": "chunked_local_attention",
                                                        "block_size": 16, "num_kv_heads": 1,
                                                        "head_size": 64,
                                                        "attention_chunk_size": 64}},
                                       "model": {"max_model_len": 64},
                                       "device": {"available_bytes": GIB}})
    with pytest.raises(PlanError, match="engine: expected SGLang settings"):
        read(vllm, Trace())


def test_resolve_fills_sglangs_defaults() -> None:
    dsa = request(dsa_layers(2), kv_cache_dtype="fp8_e4m3", enable_hisparse=True,
                  hisparse_top_k=512)
    defaults = resolve(read(dsa, Trace()), Trace())
    assert isinstance(defaults, Defaults)
    assert defaults.page_size == 64  # a DSA model's index-key page
    assert defaults.hisparse_buffer == 2 * 512
    assert defaults.latent_row is not None
    # fp8 nope (512) + a float32 scale per 128 (16) + 64 bf16 rope values (128)
    assert (defaults.latent_row.elements, defaults.latent_row.nbytes) == (656, 656)
    assert (defaults.latent_row.dtype.cache, defaults.latent_row.dtype.store) == (
        "float8_e4m3fn", "uint8")
    assert defaults.mem_fraction_static is None  # none given, no GPU memory for the rule
    plain = resolve(read(mha_request(), Trace()), Trace())
    assert isinstance(plain, Defaults)
    assert (plain.page_size, plain.swa_full_tokens_ratio, plain.hisparse_buffer) == (16, 0.8, None)
    assert plain.full_dtype is not None
    assert plain.full_dtype.store == "bfloat16"
    v4 = resolve(read(v4_request(GIB, mem_fraction_static=0.9), Trace()), Trace())
    assert isinstance(v4, DefaultsV4)
    assert (v4.page_size, v4.swa_full_tokens_ratio, v4.requested_requests) == (256, 0.1, 256)


def test_size_counts_tokens_and_requests() -> None:
    sized = size(resolve(read(mha_request(context_length=4096), Trace()), Trace()), Trace())
    assert isinstance(sized, Sized)
    token = 2 * 8 * (128 + 128) * 2
    assert (sized.available_bytes, sized.cell.total) == (GIB, token)
    assert sized.tokens == GIB // token // 16 * 16
    # 131072 tokens / 4096 x 512 = 16384, clamped to 4096, under tokens // 2
    assert sized.max_running_requests == 4096
    assert sized.req_to_token == (4097, 4096 + 4)
    v4 = size(resolve(read(v4_request(8 * GIB, mem_fraction_static=0.9), Trace()), Trace()),
              Trace())
    assert isinstance(v4, SizedV4)
    assert (v4.sizes.c4, v4.sizes.c128) == (v4.sizes.full // 4, v4.sizes.full // 128)


def test_place_lays_out_the_sized_counts() -> None:
    sized = size(resolve(read(mha_request(max_total_tokens=1024), Trace()), Trace()), Trace())
    placed = place(sized, Trace())
    (kv,) = placed.pools
    rows = 1024 + 16  # the tokens and the padding page
    assert kv.size == 2 * rows * 8 * 128 * 2
    assert [v.shape for v in placed.tensors[0].views or []] == [[rows, 8, 128]] * 2


def test_report_is_the_plan() -> None:
    req = mha_request()
    sized = size(resolve(read(req, Trace()), Trace()), Trace())
    assert report(sized, place(sized, Trace()), Trace()) == plan_sglang(req)


def test_the_values_handed_on_are_frozen() -> None:
    sized = size(resolve(read(mha_request(), Trace()), Trace()), Trace())
    assert isinstance(sized, Sized)
    for value in (sized, sized.defaults, sized.defaults.read):
        field = dataclasses.fields(value)[0].name
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(value, field, None)


# --- the trace ---------------------------------------------------------------------------


def _stage_order(trace: Trace) -> list[str]:
    return list(dict.fromkeys(decision.stage for decision in trace.decisions))


@settings(max_examples=40)
@given(small_requests())
def test_the_traced_plan_is_the_plan(req: PlanRequest) -> None:
    traced = plan_traced(req)
    assert traced.plan == plan_sglang(req)
    assert _stage_order(traced.trace) == list(STAGES)


def test_a_v4_trace_runs_the_same_stages() -> None:
    req = v4_request(8 * GIB, mem_fraction_static=0.9)
    traced = plan_traced(req)
    assert traced.plan == plan_sglang(req)
    assert _stage_order(traced.trace) == list(STAGES)
    assert traced.plan.deepseek_v4 is not None
    decided = {d.subject: d.value for d in traced.trace.decisions}
    assert decided["deepseek_v4.full_tokens"] == traced.plan.deepseek_v4.full_tokens
    assert decided["budget.cell_size_bytes"] == traced.plan.budget.cell_size_bytes


def test_every_traced_rule_has_an_anchor_and_every_stage_a_title() -> None:
    reqs = [mha_request(), request(dsa_layers(2), kv_cache_dtype="fp8_e4m3",
                                   enable_hisparse=True, hisparse_top_k=64),
            v4_request(8 * GIB, mem_fraction_static=0.9)]
    for req in reqs:
        for decision in plan_traced(req).trace.decisions:
            assert rule_doc(decision.rule).startswith("docs/planning-rules.md#sglang"), decision
            assert decision.stage in STAGE_TITLES
    assert tuple(STAGE_TITLES) == STAGES


def test_an_untraced_run_records_nothing() -> None:
    trace = Trace()
    sized = size(resolve(read(mha_request(), trace), trace), trace)
    report(sized, place(sized, trace), trace)
    assert trace.decisions == []


# --- explain -----------------------------------------------------------------------------


def test_explain_renders_the_sglang_trace() -> None:
    req = request(dsa_layers(3), kv_cache_dtype="fp8_e4m3", enable_hisparse=True,
                  hisparse_top_k=64)
    plan = plan_sglang(req)
    explanation = explain(req)
    assert [s.title for s in explanation.sections] == list(STAGE_TITLES.values())
    assert explanation.step("max_total_num_tokens").value == plan.max_total_num_tokens
    assert explanation.step("budget.cell_size_bytes").value == plan.budget.cell_size_bytes
    assert explanation.step("capacity.max_concurrency").value == plan.capacity.max_concurrency
    assert plan.hisparse is not None
    assert explanation.step("hisparse.host_tokens").value == plan.hisparse.host_tokens


def test_explain_cli_with_engine_sglang(cli: Run) -> None:
    code, out, err = cli("explain", "llama-3-8b", "--engine", "sglang", "--gpu-mem", "8GiB",
                         "--context-length", "8192", "--json")
    assert (code, err) == (0, ""), err
    explanation = Explanation.model_validate_json(out)
    assert [s.title.split(" (")[0] for s in explanation.sections] == [
        "model: layers by pool", "server defaults", "budget and tokens", "pools and buffers",
        "capacity"]
    code, out, err = cli("plan", "llama-3-8b", "--engine", "sglang", "--gpu-mem", "8GiB",
                         "--context-length", "8192", "--json")
    assert code == 0
    assert explanation.step("max_total_num_tokens").value == json.loads(out)[
        "max_total_num_tokens"]
    code, out, _ = cli("explain", "llama-3-8b", "--engine", "sglang", "--gpu-mem", "8GiB",
                       "--section", "capacity", "--json")
    assert [s.title for s in Explanation.model_validate_json(out).sections] == [
        STAGE_TITLES["report"]]
    code, _, err = cli("explain", "llama-3-8b", "--engine", "sglang", "--gpu-mem", "8GiB",
                       "--block-size", "16")
    assert code == 2
    assert "--block-size applies to vLLM only" in err


@pytest.mark.parametrize("name", sorted(registry.TARGETS))
def test_every_target_offers_a_trace_and_its_stage_titles(name: str) -> None:
    package = registry.target(name)
    assert callable(package.plan_traced)
    assert package.STAGE_TITLES
    assert all(isinstance(t, str) for t in package.STAGE_TITLES.values())


# --- the shape ---------------------------------------------------------------------------


def _calls(module: str) -> set[str]:
    """Names a module calls: `f(...)` and `module.f(...)`."""
    tree = ast.parse((PACKAGE / f"{module}.py").read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name):
                names.add(func.id)
            elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
                names.add(func.attr)
    return names


def test_every_rule_is_called_from_one_stage() -> None:
    rules: dict[str, str] = {}
    for module in RULE_MODULES:
        tree = ast.parse((PACKAGE / f"{module}.py").read_text(encoding="utf-8"))
        rules.update({node.name: module for node in tree.body
                      if isinstance(node, ast.FunctionDef) and not node.name.startswith("_")})
    callers: dict[str, list[str]] = {}
    for stage in STAGES:
        for name in _calls(stage) & set(rules):
            callers.setdefault(name, []).append(stage)
    shared = {name: stages for name, stages in callers.items() if len(stages) > 1}
    assert shared == {}
    assert len(callers) > 40  # the stages do call the rules, by these names


def test_stages_import_only_the_stages_before_them() -> None:
    for index, stage in enumerate(STAGES):
        tree = ast.parse((PACKAGE / f"{stage}.py").read_text(encoding="utf-8"))
        imported = {node.module.rsplit(".", 1)[-1] for node in ast.walk(tree)
                    if isinstance(node, ast.ImportFrom) and node.module is not None
                    and node.module.startswith("hisparse_plan.targets.sglang.")}
        later = set(STAGES[index:]) & imported
        assert later == set(), f"{stage} imports {sorted(later)}"

