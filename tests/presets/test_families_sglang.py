"""Issue 27's configs planned for SGLang 0.5.23 (`--engine sglang`), as its model classes keep
them: a window pool only for its hybrid-SWA architectures (`is_hybrid_swa_model`: gpt-oss
here), every other model's window layers kept whole in the one KV pool; Mamba-style states in
its Mamba pool; MLA rows in its MLA pool; and a refusal naming why where SGLang has no class for
the model (Jamba) or keeps caches the SGLang target does not plan (LFM2's conv-only states,
Kimi-Linear's KDA beside MLA). SGLang itself is not imported."""

from __future__ import annotations

from typing import Any

import pytest

from hisparse_plan.adapters.sglang import request_from_server_args
from hisparse_plan.errors import UnsupportedRequestError
from hisparse_plan.models.sglang_plan import SGLangPlan
from hisparse_plan.targets import plan_for_engine
from support import paths
from support.cli_support import Run

CONFIGS = paths.HF_CONFIGS
MEMORY = {"available_bytes": 8 * 2**30}


def path(name: str) -> str:
    return str(CONFIGS / name / "config.json")


def planned(name: str, **server_args: Any) -> tuple[dict[str, str], SGLangPlan]:
    """Each layer's kind in the SGLang request, and its plan."""
    args = {"tp_size": 8, "context_length": 4096, **server_args}
    request = request_from_server_args(path(name), args, MEMORY)
    plan = plan_for_engine(request)
    assert isinstance(plan, SGLangPlan)
    return {layer: spec.kind for layer, spec in request.layers.items()}, plan


@pytest.mark.parametrize(("name", "windows"), [
    ("command-a-03-2025", 48), ("exaone-4.0-32b", 48), ("gemma-3-1b-it", 22),
])
def test_window_layers_of_models_sglang_pools_whole_are_full(name: str, windows: int) -> None:
    """Not hybrid-SWA architectures in SGLang: every layer in one pool, every token kept (the
    window vLLM keeps, Cohere's 4097 included, does not apply). The request keeps the model's
    window layers and names the config's architecture; the SGLang target decides the pool."""
    kinds, plan = planned(name)
    assert list(kinds.values()).count("sliding_window") == windows
    assert {pool.name for pool in plan.pools} == {"kv"}
    assert {layer for t in plan.tensors for layer in t.layers} == set(kinds)
    assert plan.max_total_num_tokens > 0


def test_gpt_oss_keeps_its_window_pool() -> None:
    kinds, plan = planned("gpt-oss-120b", swa_full_tokens_ratio=0.5)
    assert set(kinds.values()) == {"full_attention", "sliding_window"}
    assert {pool.name for pool in plan.pools} == {"kv", "swa"}


@pytest.mark.parametrize(("name", "pools"), [
    ("granite-4.0-h-small", {"kv", "mamba_conv0", "mamba_temporal"}),
    ("qwen3.5-35b-a3b", {"kv", "mamba_conv0", "mamba_temporal"}),
    ("glm-4.7-flash", {"kv"}),
    ("minimax-m2", {"kv"}),
])
def test_families_sglang_serves_are_planned(name: str, pools: set[str]) -> None:
    _, plan = planned(name, max_mamba_cache_size=16)
    assert {pool.name for pool in plan.pools} == pools


@pytest.mark.parametrize(("name", "why"), [
    ("lfm2-1.2b", "one conv state per short-convolution layer"),
    ("lfm2-8b-a1b", "one conv state per short-convolution layer"),
    ("kimi-linear-48b-a3b-instruct", "KDA states of three conv states"),
])
def test_families_sglang_does_not_plan_are_refused_naming_why(name: str, why: str) -> None:
    with pytest.raises(UnsupportedRequestError, match=f"model_type: .* not planned for SGLang: "
                                                      f".*{why}") as caught:
        request_from_server_args(path(name), {"tp_size": 8, "context_length": 4096}, MEMORY)
    assert caught.value.field == "model_type"


def test_jamba_is_refused_by_sglangs_model_registry() -> None:
    """Jamba's config names an architecture SGLang's registry lacks: refused on reading the
    config, before its family's own refusal."""
    with pytest.raises(UnsupportedRequestError,
                       match="registry has no 'JambaForCausalLM'") as caught:
        request_from_server_args(path("ai21-jamba-mini-1.6"),
                                 {"tp_size": 8, "context_length": 4096}, MEMORY)
    assert caught.value.field == "architectures[0]"


def test_a_refusal_is_one_error_line_on_the_command_line(cli: Run) -> None:
    code, out, err = cli("plan", "--hf-config", path("lfm2-1.2b"), "--engine", "sglang",
                         "--gpu-mem", "8GiB", "--context-length", "4096")
    assert (code, out) == (2, "")
    assert err.startswith("error: ")
    assert "model_type: 'lfm2' is not planned for SGLang" in err


def test_gemma3n_keeps_a_buffer_for_every_layer_as_sglang_does() -> None:
    """SGLang's gemma3n_causal.py points layers 20 to 34 at layers 18 and 19's buffers, but
    its KV pool holds all 35 layers: a token costs 35 x 2 (K, V) x 2 heads x 256 x 2 bytes =
    71,680 bytes. SGLang 0.5.23's own sizing (references/sglang_reference.py, 8 GiB, tp 1,
    context 4096) gives 118,374 tokens."""
    args = {"tp_size": 1, "context_length": 4096}
    request = request_from_server_args(path("gemma-3n-e4b-it"), args, MEMORY)
    plan = plan_for_engine(request)
    assert isinstance(plan, SGLangPlan)
    assert [len(t.layers) for t in plan.tensors if t.pool == "kv"] == [35]
    assert plan.budget.cell_size_bytes == 35 * 2 * 2 * 256 * 2 == 71_680
    assert plan.max_total_num_tokens == 118_374
    assert len(plan.warnings) == 1
    assert "15 of 35 layers" in plan.warnings[0]
    assert "never written" in plan.warnings[0]


@pytest.mark.parametrize(("name", "field", "why"), [
    ("mamba-small", "model_type", "Mamba layers alone"),
    ("falcon-mamba-small", "model_type", "Mamba layers alone"),
    ("mamba2-small", "model_type", "Mamba layers alone"),
    ("minicpm3-small", "model_type", "keeps MLA latent rows where vLLM keeps per-head K and V"),
    ("zamba2-small", "architectures[0]", "registry has no 'Zamba2ForCausalLM'"),
    ("smollm3-small", "architectures[0]", "registry has no 'SmolLM3ForCausalLM'"),
])
def test_issue40_families_are_refused_for_sglang_naming_why(name: str, field: str,
                                                            why: str) -> None:
    with pytest.raises(UnsupportedRequestError, match=why) as caught:
        request_from_server_args(path(name), {"tp_size": 1, "context_length": 2048}, MEMORY)
    assert caught.value.field == field
