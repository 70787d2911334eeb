"""`diff`, `manifest` and `transfer` agree on what can move: all three read one decision
(exchange/movable.py). Two Whisper plans are not transfer-compatible (their cross-attention
layers are refused by transfer, so by diff, naming the same layer), a manifest marks those
layers refused, and a layer that reads another's pages on one side only is refused by both."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import hisparse_plan as hp
from hisparse_plan.exchange import diff, manifest
from hisparse_plan.exchange.transfer import Instance, TransferRefused, TransferRequest
from hisparse_plan.exchange.transfer import build_transfer as transfer
from hisparse_plan.presets import Settings, build_request
from hisparse_plan.presets.config_file import model_from_config
from support import paths
from support.cli_support import Run
from support.transfer_support import request_blocks

WHISPER = paths.HF_CONFIGS / "whisper-small" / "config.json"
CROSS = ".decoder.layers.0.layers.encoder_attn.attn"
PAGE_TOKENS = 16


def whisper_plan(blocks: int) -> hp.KVCachePlan:
    """Whisper-small's decoder as the config reader gives it (a self- and a cross-attention
    layer per decoder layer) in `blocks` blocks' worth of memory."""
    arch = model_from_config(json.loads(WHISPER.read_text()), origin="whisper",
                             use_transformers=False)
    request = build_request(arch, Settings()).model_dump(mode="json")
    plan = hp.plan({**request, "device": {**request["device"], "available_bytes": 1 << 30}})
    page = plan.device_pool.bytes_per_block
    request["device"]["available_bytes"] = blocks * page
    return hp.plan(request)


def sharing_plan(shared: bool) -> hp.KVCachePlan:
    """Three full-attention layers; with `shared`, l2 reads l0's pages."""
    layer: dict[str, Any] = {"kind": "full_attention", "block_size": PAGE_TOKENS,
                             "num_kv_heads": 2, "head_size": 64}
    layers = {"l0": layer, "l1": layer,
              "l2": {**layer, "kv_sharing_target": "l0"} if shared else layer}
    return hp.plan({"layers": layers, "model": {"max_model_len": 1024},
                    "device": {"available_bytes": 1 << 24}})


def transfer_refusal(a: hp.KVCachePlan, b: hp.KVCachePlan) -> TransferRefused:
    src, dst = Instance([a]), Instance([b])
    request = TransferRequest(num_tokens=40, source_blocks=request_blocks(src, 40, 1),
                              destination_blocks=request_blocks(dst, 40, 2))
    with pytest.raises(TransferRefused) as caught:
        transfer(src, dst, request)
    return caught.value


def test_diff_refuses_the_cross_attention_layers_transfer_refuses() -> None:
    a, b = whisper_plan(160), whisper_plan(200)
    refused = transfer_refusal(a, b)
    result = diff(a, b)
    assert not result.compatible
    assert (result.layer, result.field) == (refused.layer, "kind") == (CROSS, "kind")
    assert "cross_attention" in result.message


def test_a_manifest_marks_what_transfer_refuses() -> None:
    entries = {entry.name: entry for entry in manifest(whisper_plan(160)).layers}
    refused = {name for name, entry in entries.items() if entry.refused is not None}
    assert refused == {name for name in entries if "encoder_attn" in name}
    assert len(refused) == len(entries) // 2  # one cross layer beside each self layer
    assert all("cross_attention" in str(entries[name].refused) for name in refused)
    # A layer that moves says nothing of it in JSON.
    assert "refused" not in manifest(sharing_plan(False)).layers[0].model_dump(mode="json")


def test_diff_of_manifests_refuses_as_of_plans() -> None:
    a, b = whisper_plan(160), whisper_plan(160)
    assert diff(manifest(a), manifest(b)).layer == diff(a, b).layer == CROSS


def test_sharing_on_one_side_only_is_refused_by_both() -> None:
    a, b = sharing_plan(True), sharing_plan(False)
    refused = transfer_refusal(a, b)
    result = diff(a, b)
    assert not result.compatible
    assert (result.layer, result.field) == (refused.layer, refused.what) == (
        "l2", "kv_sharing_target")


def test_alike_plans_move_under_both() -> None:
    """The agreement is not a refusal of everything: two plans of one sharing layout are
    compatible, and transfer builds their program."""
    a, b = sharing_plan(True), sharing_plan(True)
    assert diff(a, b).compatible
    src, dst = Instance([a]), Instance([b])
    transfer(src, dst, TransferRequest(num_tokens=40, source_blocks=request_blocks(src, 40, 1),
                                       destination_blocks=request_blocks(dst, 40, 2)))


def test_the_cli_diff_refuses_two_whisper_plans(cli: Run, tmp_path: Path) -> None:
    paths = []
    for blocks in (160, 200):
        path = tmp_path / f"whisper{blocks}.json"
        path.write_text(whisper_plan(blocks).model_dump_json())
        paths.append(str(path))
    code, _, err = cli("diff", *paths)
    assert code == 1
    assert "not transfer-compatible" in err
    assert "cross_attention" in err
