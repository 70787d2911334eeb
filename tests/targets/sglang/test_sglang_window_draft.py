"""SGLang 0.5.23 speculative decoding with a draft of sliding-window layers (gpt-oss-20b drafting
with its own checkpoint: `speculative_draft_model_path: "@model"`), pinned to figures SGLang's
own code computed, its refusals, and check_plan's proof of the draft's window pool.

The pinned figures came from SGLang's own classes on the meta device: the target's pools by
`KVCacheConfigurator.configure` (HybridSWAPoolConfigurator, or SWARequestCapPoolConfigurator
with the radix cache off) and the draft worker's by `KVCacheConfigurator(is_draft_worker=True)`
handed the target's memory_pool_config, req_to_token_pool and allocator (its SWAKVPool):

    PYTHONPATH=references/sglang_stubs:references /work/sglang/bin/python \\
        references/sglang_reference.py references/sglang_cases/gptoss20b_eagle_self.json \\
        references/sglang_cases/gptoss20b_eagle_self_radix_off.json \\
        references/sglang_cases/gptoss20b_pp2_eagle_self_radix_off.json \\
        references/sglang_cases/llama4_scout_tp8_eagle_self.json

and the whole reports (every buffer of the target's and the draft's pools) agree with ours:

    python references/sglang_diff.py --cases references/sglang_cases/*eagle_self*.json
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_sglang_speculative import case

from hisparse_plan.adapters.sglang import rank_plans, report_for_case, request_from_server_args
from hisparse_plan.checking import check_plan
from hisparse_plan.errors import PlanInvariantError, UnsupportedRequestError
from hisparse_plan.models.request import PlanRequest
from hisparse_plan.models.sglang_plan import SGLangPlan
from hisparse_plan.targets.sglang import plan_sglang
from support import paths
from support.cli_support import Run
from support.sglang_requests import mha, request, swa

REPO = paths.REPO
GPTOSS_20B = REPO / "tests" / "hf_configs" / "gpt-oss-20b" / "config.json"
LLAMA = REPO / "tests" / "hf_configs" / "llama-3.1-8b-instruct" / "config.json"


def case_request(name: str, **server_args: Any) -> PlanRequest:
    found = case(name)
    return request_from_server_args(found["config"], {**found["server_args"], **server_args},
                                    found["memory"], draft_config=found.get("draft_config"))


def pool_bytes(entry: dict[str, Any]) -> int:
    storages = {buffer["storage"]: buffer["storage_nbytes"] for buffer in entry["buffers"]}
    return sum(storages.values())


# (case, tokens, cell bytes, running requests, request table, {pool: (tokens, bytes)} of the
# target's pools, the same of the draft worker's), SGLang's own figures (docstring).
PINNED = [
    # Radix cache on: the window pool int(0.8 x the full tokens); the draft's 24 layers (12
    # window, 12 full) in the cell at the target's geometry.
    ("gptoss20b_eagle_self", 1103295, 88473.6, 48, [49, 8200],
     {"kv": (1103295, 27114602496), "swa": (882636, 21691686912)},
     {"kv": (1103295, 27114602496), "swa": (882636, 21691686912)}),
    # Radix cache off: the window pool capped for 48 requests (SGLang's default with
    # speculative decoding), priced with the draft's window layers; the full pool the rest.
    ("gptoss20b_eagle_self_radix_off", 1946586, 88473.6, 48, [49, 8200],
     {"kv": (1946586, 47839322112), "swa": (39345, 966967296)},
     {"kv": (1946586, 47839322112), "swa": (39345, 966967296)}),
    # Llama-4 Scout at TP 8 drafting with itself: SGLang's window layers are every layer but
    # each fourth (36 of 48), in the draft as in the target; 512 bytes a layer and token.
    ("llama4_scout_tp8_eagle_self", 2336389, 41779.2, 48, [49, 8200],
     {"kv": (2336389, 14354780160), "swa": (1869111, 34451472384)},
     {"kv": (2336389, 14354780160), "swa": (1869111, 34451472384)}),
]


@pytest.mark.parametrize(("name", "tokens", "cell", "requests", "table", "pools", "draft"),
                         PINNED, ids=[row[0] for row in PINNED])
def test_figures_sglang_computed(
    name: str, tokens: int, cell: float, requests: int, table: list[int],
    pools: dict[str, tuple[int, int]], draft: dict[str, tuple[int, int]],
) -> None:
    report = report_for_case(case(name))
    assert "error" not in report, report.get("error")
    got = (report["max_total_num_tokens"], report["cell_size_bytes"],
           report["max_running_requests"], report["req_to_token"]["shape"])
    assert got == (tokens, cell, requests, table)
    assert {e["name"]: (e["tokens"], pool_bytes(e)) for e in report["pools"]} == pools
    assert {e["name"]: (e["tokens"], pool_bytes(e)) for e in report["draft_pools"]} == draft


def test_the_figures_by_hand() -> None:
    """gpt-oss-20b at TP 1: 8 KV heads of 64, bf16, so a layer's K and V take 2,048 bytes a
    token; 12 full and 12 window layers, and as many in the draft. The cell: (12 + 12) x 2048
    + 0.8 x (12 + 12) x 2048. Radix off, 48 requests: each holds the window (128), an eviction
    interval a draft token (128 x 4), a page and two overlapped decode steps (2 x 4); two
    prefill chunks of 4096 and a page beside them."""
    layer = 8 * 64 * 2 * 2
    assert 24 * layer + 0.8 * 24 * layer == 88473.6
    cap = (128 + 128 * 4 + 1 + 2 * 4) * 48 + 2 * 4096 + 1
    assert cap == 39345
    on, off = (plan_sglang(case_request(name)) for name in (
        "gptoss20b_eagle_self", "gptoss20b_eagle_self_radix_off"))
    budget = off.budget.available_bytes
    assert off.max_total_num_tokens == (budget - cap * 24 * layer) // (24 * layer)
    assert on.max_total_num_tokens == int(budget // 88473.6)
    window = {pool.name: pool.num_blocks - 1 for pool in off.pools}
    assert window["swa"] == window["draft_swa"] == cap


def test_the_draft_keeps_its_window_layers_apart() -> None:
    request = case_request("gptoss20b_eagle_self")
    plan = plan_sglang(request)
    check_plan(plan, request=request)
    spec = plan.speculative
    assert spec is not None
    assert spec.draft_window_layers == [f"draft.layers.{i}" for i in range(0, 24, 2)]
    held = {name: sorted(layer for t in plan.tensors if t.pool == name for layer in t.layers)
            for name in ("draft_kv", "draft_swa")}
    assert held["draft_swa"] == sorted(spec.draft_window_layers)
    assert held["draft_kv"] == sorted(f"draft.layers.{i}" for i in range(1, 24, 2))
    # The draft's full layers alone are the bytes it adds to a full token.
    assert spec.draft_cell_size_bytes == 12 * 2048


def test_only_the_last_pipeline_rank_builds_the_draft_pools() -> None:
    """Two stages, radix off, 64 requests (SGLang's figures: 2,602,531 tokens on both ranks,
    cell 66,355.2 = (6 + 12) x 2048 x 1.8, window pools of 45,377 tokens: one decode step and
    one prefill chunk in flight, the overlap scheduler off under pipeline stages)."""
    first, last = rank_plans(case_request("gptoss20b_pp2_eagle_self_radix_off"))
    for plan in (first, last):
        check_plan(plan)
        assert (plan.max_total_num_tokens, plan.budget.cell_size_bytes) == (2602531, 66355.2)
    assert not [pool.name for pool in first.pools if pool.name.startswith("draft_")]
    drafted = {pool.name: pool.num_blocks - 1 for pool in last.pools
               if pool.name.startswith("draft_")}
    assert drafted == {"draft_kv": 2602531, "draft_swa": 45377}


# --- refusals --------------------------------------------------------------------------------


def window_request(**engine: Any) -> PlanRequest:
    layers = {f"l{i}": (swa(128) if i % 2 else mha()) for i in range(4)}
    return request(layers, available=2 << 30, page_size=16, speculative_algorithm="EAGLE",
                   speculative_draft_num_layers=4, **engine)


@pytest.mark.parametrize(("engine", "match"), [
    ({"speculative_draft_window_layers": 2}, "expected their ids"),
    ({"speculative_draft_window_layers": 2, "speculative_draft_window_layer_ids": [1]},
     "expected 2 distinct ids"),
    ({"speculative_draft_window_layers": 2, "speculative_draft_window_layer_ids": [1, 1]},
     "expected 2 distinct ids"),
    ({"speculative_draft_window_layers": 2, "speculative_draft_window_layer_ids": [1, 4]},
     "expected ids of the draft's 4 layers"),
    ({"speculative_draft_window_layers": 4, "speculative_draft_window_layer_ids": [0, 1, 2, 3]},
     "window layers only"),
])
def test_window_ids_are_refused_unless_sound(engine: dict[str, Any], match: str) -> None:
    with pytest.raises(UnsupportedRequestError, match=match) as info:
        plan_sglang(window_request(**engine))
    assert info.value.field == "engine.speculative_draft_window_layer_ids"


def test_window_ids_without_an_algorithm_are_refused() -> None:
    layers = {f"l{i}": (swa(128) if i % 2 else mha()) for i in range(4)}
    found = request(layers, available=2 << 30, page_size=16,
                    speculative_draft_window_layer_ids=[1])
    with pytest.raises(UnsupportedRequestError, match="need a speculative_algorithm") as info:
        plan_sglang(found)
    assert info.value.field == "engine.speculative_draft_window_layer_ids"


def test_a_window_draft_beside_a_target_without_window_pool_is_refused() -> None:
    # SGLang's draft worker reads the target's window token count, which a Llama target's
    # memory_pool_config has none of: it fails building the draft pool (a TypeError on None,
    # sglang_reference.py on this case).
    draft = json.loads(GPTOSS_20B.read_text())
    draft.update(num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"])
    found = request_from_server_args(
        str(LLAMA), {"tp_size": 1, "context_length": 8192, "speculative_algorithm": "EAGLE3"},
        {"available_bytes": 8 << 30}, draft_config=draft)
    with pytest.raises(UnsupportedRequestError, match="without both a full and a window") as info:
        plan_sglang(found)
    assert info.value.field == "engine.speculative_draft_window_layers"


def test_a_window_draft_beside_window_layers_of_another_shape_is_refused() -> None:
    layers = {"l0": mha(), "l1": swa(128, heads=4)}
    found = request(layers, available=2 << 30, page_size=16, speculative_algorithm="EAGLE",
                    speculative_draft_num_layers=2, speculative_draft_window_layers=1,
                    speculative_draft_window_layer_ids=[1])
    with pytest.raises(UnsupportedRequestError, match="another head shape"):
        plan_sglang(found)


# --- check_plan: the draft's window pool proven from the plan alone ---------------------------


def window_plan() -> SGLangPlan:
    return plan_sglang(window_request(speculative_draft_window_layers=2,
                                      speculative_draft_window_layer_ids=[1, 3]))


def spec_copy(plan: SGLangPlan, **changes: Any) -> SGLangPlan:
    spec = plan.speculative
    assert spec is not None
    return plan.model_copy(update={"speculative": spec.model_copy(update=changes)})


def test_check_plan_proves_the_draft_window_pool() -> None:
    plan = window_plan()
    check_plan(plan, request=window_request(speculative_draft_window_layers=2,
                                            speculative_draft_window_layer_ids=[1, 3]))
    fewer = [pool.model_copy(update={"num_blocks": pool.num_blocks - 1})
             if pool.name == "draft_swa" else pool for pool in plan.pools]
    with pytest.raises(PlanInvariantError, match="draft_swa"):
        check_plan(plan.model_copy(update={"pools": fewer}))
    with pytest.raises(PlanInvariantError, match="draft_swa"):
        check_plan(spec_copy(plan, draft_window_layers=[]))
    with pytest.raises(PlanInvariantError, match="holds layers"):
        check_plan(spec_copy(plan, draft_window_layers=["draft.layers.0", "draft.layers.3"]))
    with pytest.raises(PlanInvariantError, match="not all"):
        check_plan(spec_copy(plan, draft_window_layers=list(plan.speculative.draft_layers)
                             if plan.speculative else []))
    # The draft's window layers priced as full ones: the cell no longer adds up.
    with pytest.raises(PlanInvariantError, match="draft_cell_size_bytes"):
        check_plan(spec_copy(plan, draft_cell_size_bytes=4 * 4096))


def test_check_plan_refuses_a_plan_without_the_window_draft_against_its_request() -> None:
    full_draft = plan_sglang(window_request())
    with pytest.raises(PlanInvariantError):
        check_plan(full_draft, request=window_request(
            speculative_draft_window_layers=2, speculative_draft_window_layer_ids=[1, 3]))


# --- the CLI ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("model", "windows"), [("gpt-oss-120b", "18"), ("llama-4-scout", "36")])
def test_plan_with_the_models_own_checkpoint_as_draft(cli: Run, model: str, windows: str) -> None:
    # gpt-oss: its layer_types name the window layers; the Llama-4 preset's architecture is
    # not SGLang's named one, so the draft's window layers are the target's own (chunked).
    code, out, err = cli("plan", model, "--engine", "sglang", "--gpu", "h200",
                         "--tp", "8", "--speculative-algorithm", "EAGLE",
                         "--speculative-draft-model-path", "@model")
    assert (code, err) == (0, ""), err
    rows: dict[str, list[str]] = {}
    for line in out.splitlines():  # the pools table comes first, then the buffers
        if line.strip():
            rows.setdefault(line.split()[0], line.split())
    assert rows["draft_swa"][2] == rows["swa"][2]  # the target's window tokens
    assert rows["draft_kv"][2] == rows["kv"][2]
    assert rows["draft_swa"][3] == rows["swa"][3] == windows


def test_plan_with_a_window_draft_folder(cli: Run, tmp_path: Path) -> None:
    # A two-layer gpt-oss draft beside the gpt-oss-120b preset at 40 GiB (SGLang's own figures
    # for this deployment, sglang_reference.py: 613,202 full and 490,561 window tokens).
    draft = json.loads((REPO / "tests" / "hf_configs" / "gpt-oss-120b" / "config.json")
                       .read_text())
    draft.update(num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"])
    (tmp_path / "config.json").write_text(json.dumps(draft))
    code, out, err = cli("plan", "gpt-oss-120b", "--engine", "sglang", "--gpu-mem", "40GiB",
                         "--speculative-algorithm", "EAGLE3",
                         "--speculative-draft-model-path", str(tmp_path), "--json")
    assert (code, err) == (0, ""), err
    plan = json.loads(out)
    assert plan["max_total_num_tokens"] == 613202
    blocks = {pool["name"]: pool["num_blocks"] - 1 for pool in plan["pools"]}
    assert (blocks["draft_kv"], blocks["draft_swa"]) == (613202, 490561)
    assert plan["speculative"]["draft_window_layers"] == ["draft.layers.0"]


def test_capacity_names_the_draft_window_layers(cli: Run) -> None:
    code, out, err = cli("capacity", "--hf-config", str(GPTOSS_20B), "--engine", "sglang",
                         "--gpu", "h200", "--weights-bytes", "14GB", "--context-length", "8192",
                         "--speculative-algorithm", "EAGLE",
                         "--speculative-draft-model-path", "@model", "--json")
    assert (code, err) == (0, ""), err
    figures = json.loads(out)[0]
    assert figures["bytes_per_token"] == 88473.6
    assert "draft window layers 12" in figures["defaults"]


@pytest.mark.parametrize(("extra", "match"), [
    ((), "needs --speculative-algorithm"),
    (("--speculative-algorithm", "EAGLE", "--speculative-draft-num-layers", "2"),
     "both give the draft's layers"),
    (("--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", "/nonexistent"),
     "--speculative-draft-model-path /nonexistent: /nonexistent/config.json"),
])
def test_the_draft_path_flag_refuses_what_it_cannot_read(
    cli: Run, extra: tuple[str, ...], match: str
) -> None:
    argv = ["plan", "gpt-oss-120b", "--engine", "sglang", "--gpu-mem", "40GiB", *extra]
    if "--speculative-draft-model-path" not in extra:
        argv += ["--speculative-draft-model-path", "@model"]
    code, _, err = cli(*argv)
    assert code != 0
    assert match in err


def test_the_adapter_reads_the_drafts_window_layer_ids() -> None:
    engine = case_request("gptoss20b_eagle_self").engine
    assert engine is not None
    assert engine.speculative_draft_window_layers == 12
    assert engine.speculative_draft_window_layer_ids == list(range(0, 24, 2))
    llama4 = case_request("llama4_scout_tp8_eagle_self").engine
    assert llama4 is not None
    assert llama4.speculative_draft_num_layers == 48  # its text_config's layers
    assert llama4.speculative_draft_window_layer_ids == [i for i in range(48) if (i + 1) % 4]
