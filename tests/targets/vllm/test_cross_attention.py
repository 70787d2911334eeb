"""Encoder-decoder models' cross-attention caches (issue 40): the contract's cross_attention
kind, vLLM 0.34's grouping and sizing of it (Whisper, pinned to vLLM's own planner), the config
reader's Whisper, and the places that refuse it by name (SGLang, transfers, one KV cache
manager)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

import hisparse_plan as hp
from hisparse_plan.exchange.transfer import Instance, TransferRefused, TransferRequest
from hisparse_plan.exchange.transfer import build_transfer as transfer
from hisparse_plan.models import CrossAttentionSpec, FullAttentionSpec, KVLayerSpec, PlanRequest
from hisparse_plan.presets import ConfigError, RegularArchitecture, Settings, build_request
from hisparse_plan.presets.config_file import model_from_config
from support import paths
from support.cli_support import Run
from support.transfer_support import request_blocks
from support.whisper import GIB, WHISPER, whisper_config, whisper_request

SELF = ".decoder.layers.{}.layers.self_attn.attn"
CROSS = ".decoder.layers.{}.layers.encoder_attn.attn"






# -- the contract ---------------------------------------------------------------------------

LAYER = {"kind": "cross_attention", "block_size": 64, "num_kv_heads": 4, "head_size": 64}


def test_a_cross_attention_layer_reads_and_writes_json() -> None:
    request = PlanRequest.model_validate({"layers": {"x": LAYER, "y": {**LAYER,
                                                                       "kind": "full_attention"}},
                                          "model": {"max_model_len": 448},
                                          "device": {"available_bytes": GIB}})
    spec = request.layers["x"]
    assert isinstance(spec, CrossAttentionSpec)
    assert not isinstance(spec, FullAttentionSpec)
    # Natural page: 64 tokens x 4 heads x (64 K + 64 V) elements x 2 bytes.
    assert spec.page_size_bytes == 64 * 4 * 128 * 2
    assert PlanRequest.model_validate_json(request.model_dump_json()) == request
    plan = hp.plan(request)
    assert hp.KVCachePlan.model_validate_json(plan.model_dump_json()) == plan
    assert [group.spec.kind for group in plan.groups] == ["cross_attention", "full_attention"]


@pytest.mark.parametrize(("change", "field"), [
    ({"num_kv_heads": None}, "num_kv_heads"),
    ({"head_size": 0}, "head_size"),
    ({"sliding_window": 128}, "sliding_window"),
    ({"page_size_bytes": 1}, "page_size_bytes"),
])
def test_a_bad_cross_attention_layer_is_refused_naming_the_field(
    change: dict[str, Any], field: str,
) -> None:
    layer = {key: value for key, value in {**LAYER, **change}.items() if value is not None}
    with pytest.raises(ValidationError) as caught:
        PlanRequest.model_validate({"layers": {"x": layer}, "model": {"max_model_len": 448},
                                    "device": {"available_bytes": GIB}})
    assert field in str(caught.value)
    assert "cross_attention" in str(caught.value)


def test_an_unknown_kind_names_cross_attention_among_the_kinds() -> None:
    with pytest.raises(ValidationError, match="cross_attention, sliding_window_mla"):
        PlanRequest.model_validate({"layers": {"x": {**LAYER, "kind": "encoder_only"}},
                                    "model": {"max_model_len": 448},
                                    "device": {"available_bytes": GIB}})


# -- vLLM 0.34's plan of Whisper -------------------------------------------------------------
# Figures from vLLM 0.34.0's own model class and planner (WhisperForConditionalGeneration built
# on meta, vLLM's engine config for the fixture, get_kv_cache_configs), by
#   PYTHONPATH=src /work/vllm-venv/bin/python references/vllm_cross_attention.py
#   ... --no-hybrid          (the refusal)
#   ... --layout LBNHC --memory 123456789
# Both give 2 groups: the self-attention layers (FullAttentionSpec, 7 blocks a request) and
# the cross-attention layers (CrossAttentionSpec, 32 blocks a request), pages of 65536 bytes.

PAGE = 64 * 4 * (64 + 64) * 2
"""One layer's page: block 64, 4 KV heads, K and V of 64 bfloat16 elements."""


def test_whisper_plans_as_vllm_does() -> None:
    request = whisper_request()
    plan = hp.plan(request)
    hp.check_plan(plan, request=request)
    layers = [[SELF.format(i) for i in range(2)], [CROSS.format(i) for i in range(2)]]
    assert [(g.spec.kind, g.layer_names, g.spec.page_size_bytes, g.spec.block_size)
            for g in plan.groups] == [("full_attention", layers[0], PAGE, 64),
                                      ("cross_attention", layers[1], PAGE, 64)]
    # vLLM: num_blocks 8192; two tensors of 1 GiB at offset 0 (the groups share block ids),
    # layer stride 65536, block stride 131072; max concurrency 210.05128205128204.
    assert plan.num_blocks == 8192 == GIB // (2 * PAGE)
    assert [(t.layers, t.size, t.offset, t.layer_stride, t.block_stride) for t in plan.tensors] == [
        (names, GIB, 0, PAGE, 2 * PAGE) for names in layers]
    # A request holds ceil(448 / 64) = 7 self-attention blocks and, whatever its length,
    # ceil(2048 / 64) = 32 cross-attention blocks (the encoder budget, max_num_batched_tokens).
    assert plan.capacity.max_concurrency == 210.05128205128204 == 8192 / (7 + 32)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed here")
@pytest.mark.parametrize(("layout", "memory"), [("BLNHC", GIB), ("LBNHC", 123456789)])
def test_whisper_plans_as_the_installed_vllm_does(layout: str, memory: int) -> None:
    """The figures above, live: references/vllm_cross_attention.py runs vLLM's own model class
    and planner in a process of its own."""
    script = paths.REPO / "references" / "vllm_cross_attention.py"
    done = subprocess.run(
        [sys.executable, str(script), "--layout", layout, "--memory", str(memory)],
        capture_output=True, text=True, timeout=600, check=False,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(Path(hp.__file__).parent.parent), os.environ.get("PYTHONPATH", "")])})
    assert done.returncode == 0, done.stderr[-2000:]
    theirs = json.loads(done.stdout)
    plan = hp.plan(whisper_request(memory=memory, layout=layout,
                                   tokens=theirs["max_num_batched_tokens"]))
    kinds = {"FullAttentionSpec": "full_attention", "CrossAttentionSpec": "cross_attention"}
    assert [(kinds[g["kind"]], g["layers"], g["page_size_bytes"]) for g in theirs["groups"]] == [
        (g.spec.kind, g.layer_names, g.spec.page_size_bytes) for g in plan.groups]
    assert theirs["num_blocks"] == plan.num_blocks
    assert theirs["tensors"] == [
        {"size": t.size, "layers": t.layers, "offset": t.offset, "layer_stride": t.layer_stride,
         "block_stride": t.block_stride} for t in plan.tensors]
    assert theirs["max_concurrency"] == plan.capacity.max_concurrency


def test_whisper_layer_outer_plans_as_vllm_does() -> None:
    plan = hp.plan(whisper_request(memory=123456789, layout="LBNHC"))
    # vLLM: num_blocks 941, each tensor 123338752 bytes, layer stride 61669376, block stride
    # 65536, offset 0; max concurrency 24.128205128205128.
    blocks = 123456789 // (2 * PAGE)
    assert plan.num_blocks == 941 == blocks
    assert [(t.size, t.offset, t.layer_stride, t.block_stride) for t in plan.tensors] == [
        (123338752, 0, 61669376, PAGE)] * 2 == [(2 * blocks * PAGE, 0, blocks * PAGE, PAGE)] * 2
    assert plan.capacity.max_concurrency == 24.128205128205128 == 941 / 39


@pytest.mark.parametrize(("edit", "expected"), [
    # Cross-attention blocks sized by the length (7 + 7 a request) instead of the encoder.
    (lambda plan: plan["capacity"].update(max_concurrency=8192 / 14), 8192 / 39),
    # The cross-attention group relabelled full attention: its capacity no longer agrees.
    (lambda plan: plan["groups"][1]["spec"].update(kind="full_attention"), 8192 / 14),
])
def test_check_plan_holds_cross_attention_to_vllms_sizing(
    edit: Callable[[dict[str, Any]], object], expected: float,
) -> None:
    dumped = hp.plan(whisper_request()).model_dump(mode="json")
    edit(dumped)
    with pytest.raises(hp.PlanInvariantError, match=rf"max_concurrency .*expected {expected}"):
        hp.check_plan(hp.KVCachePlan.model_validate(dumped))


def test_cross_attention_blocks_follow_the_encoder_budget_not_the_length() -> None:
    """vLLM's CrossAttentionSpec.max_memory_usage_bytes: ceil(max_num_encoder_input_tokens /
    block_size) pages, max_num_encoder_input_tokens being max_num_batched_tokens; the request's
    length and the batches in flight do not enter."""
    for tokens, batches, length in ((8192, 1, 448), (8192, 2, 448), (1500, 1, 100)):
        request = whisper_request(tokens=tokens, max_concurrent_batches=batches)
        request["model"]["max_model_len"] = length
        plan = hp.plan(request)
        per_request = -(-length // 64) + -(-tokens // 64)
        assert plan.capacity.max_concurrency == plan.num_blocks / per_request


def test_too_little_memory_for_one_request_is_refused() -> None:
    """One request needs 7 + 32 blocks beside the null block: 40 blocks of 131072 bytes."""
    hp.plan(whisper_request(memory=40 * 2 * PAGE))
    with pytest.raises(hp.CapacityError, match="one 448-token request needs 39 blocks"):
        hp.plan(whisper_request(memory=40 * 2 * PAGE - 1))


def test_auto_fit_keeps_the_cross_attention_blocks() -> None:
    """Auto-fit shortens the decoder's length only: 32 encoder blocks stay, so 40 blocks
    (null block, 32 cross, 7 self) fit 448 tokens and 36 blocks fit 3 x 64 = 192."""
    request = whisper_request(memory=36 * 2 * PAGE)
    request["model"]["auto_fit_max_model_len"] = True
    plan = hp.plan(request)
    hp.check_plan(plan, request=request)
    assert (plan.num_blocks, plan.fitted_max_model_len) == (36, 192)


def test_one_kv_cache_manager_refuses_cross_attention_as_vllm_does() -> None:
    """vLLM 0.34 with the hybrid manager disabled: `_promote_local_kv_cache_specs` finds
    full_attention beside cross_attention, promotes nothing, and the layers are still not one
    type: "ValueError: Failed to promote local KV cache specs to one unified type."."""
    request = whisper_request(disable_hybrid_kv_cache_manager=True)
    with pytest.raises(hp.PlanError, match="cross_attention") as caught:
        hp.plan(request)
    assert caught.value.field == "scheduler.disable_hybrid_kv_cache_manager"


def test_a_model_of_cross_attention_layers_alone_is_one_group() -> None:
    """Cross-attention layers are one family (vLLM's CrossAttentionManager): alike, they are one
    spec; of two geometries, one uniform_type group."""
    layers = {"a": LAYER, "b": {**LAYER, "num_kv_heads": 2}}
    plan = hp.plan({"layers": layers, "model": {"max_model_len": 448},
                    "device": {"available_bytes": GIB}})
    (group,) = plan.groups
    assert group.spec.kind == "uniform_type"


# -- the config reader ----------------------------------------------------------------------

def test_the_reader_reads_whispers_decoder() -> None:
    """decoder_layers of decoder_attention_heads heads, d_model / heads wide, a KV head per
    head; the context is max_target_positions (vLLM's layer names, whisper.py)."""
    for use_transformers in (False, True):
        arch = model_from_config(whisper_config(), origin="whisper",
                                 use_transformers=use_transformers)
        request = build_request(arch, Settings(tp=2))
        assert request.model.max_model_len == 448
        assert list(request.layers) == [SELF.format(0), CROSS.format(0), SELF.format(1),
                                        CROSS.format(1)]
        specs = [s for s in request.layers.values() if isinstance(s, KVLayerSpec)]
        assert [(s.kind, s.num_kv_heads, s.head_size, s.head_size_v) for s in specs] == [
            ("full_attention", 2, 64, 64), ("cross_attention", 2, 64, 64)] * 2


@pytest.mark.parametrize(("change", "field"), [
    ({"d_model": 250}, "d_model"),
    ({"decoder_layers": 0}, "decoder_layers"),
    ({"decoder_attention_heads": None}, "decoder_attention_heads"),
    ({"max_target_positions": "long"}, "max_target_positions"),
    ({"max_source_positions": 0}, "max_source_positions"),
])
def test_a_bad_whisper_config_is_refused_naming_the_field(
    change: dict[str, Any], field: str,
) -> None:
    with pytest.raises(ConfigError) as caught:
        model_from_config({**whisper_config(), **change}, origin="whisper",
                          use_transformers=False)
    assert caught.value.field == field
    assert f"{field}:" in str(caught.value)


def test_whisper_needs_a_step_of_one_encoder_input() -> None:
    """vLLM 0.34 disables chunked multimodal input for encoder-decoder models and refuses (when
    its scheduler starts, compute_mm_encoder_budget) fewer batched tokens than one input's
    max_source_positions (1500)."""
    arch = model_from_config(whisper_config(), origin="whisper", use_transformers=False)
    assert isinstance(arch, RegularArchitecture)
    assert arch.encoder_tokens == 1500
    build_request(arch, Settings(max_num_batched_tokens=1500))
    with pytest.raises(ConfigError, match="expected at least 1500, got 1499") as caught:
        build_request(arch, Settings(max_num_batched_tokens=1499))
    assert caught.value.field == "max_num_batched_tokens"


def test_whisper_has_no_pipeline_stages() -> None:
    """vLLM's WhisperForConditionalGeneration does not implement SupportsPP."""
    arch = model_from_config(whisper_config(), origin="whisper", use_transformers=False)
    with pytest.raises(ConfigError, match="pipeline parallelism") as caught:
        build_request(arch, Settings(pp=2))
    assert caught.value.field == "pp"


def test_sglang_refuses_whisper_naming_why(cli: Run) -> None:
    code, _, err = cli("plan", "--hf-config", str(WHISPER), "--engine", "sglang")
    assert code != 0
    assert "SGLang 0.5.23 serves Whisper" in err
    assert "token pool" in err


def test_a_cross_attention_layer_is_not_planned_for_sglang() -> None:
    request = whisper_request()
    request["engine"] = {"name": "sglang", "context_length": 448}
    with pytest.raises(hp.PlanError, match="cross_attention"):
        hp.plan_for_engine(request)


# -- transfers ------------------------------------------------------------------------------

def test_a_transfer_refuses_cross_attention_by_name() -> None:
    request = whisper_request(memory=64 * 2 * PAGE)
    plan = hp.plan(request)
    side = Instance([plan])
    transfer_request = TransferRequest(num_tokens=40, source_blocks=request_blocks(side, 40, 1),
                                       destination_blocks=request_blocks(side, 40, 2))
    with pytest.raises(TransferRefused, match="cross_attention") as caught:
        transfer(side, side, transfer_request)
    assert caught.value.layer == CROSS.format(0)
