"""Converting a plan back to vLLM specs once per distinct (our spec, engine spec) pair still
hands every layer the engine's own spec object, and keeps what tells engine specs apart."""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("vllm")

import hisparse_plan as hp
from hisparse_plan.adapters.vllm.specs import SpecBuilder, fresh_layer_spec
from hisparse_plan.models import LayerSpec


def test_each_layer_gets_its_own_engine_spec_back() -> None:
    request = hp.PlanRequest.model_validate({
        "layers": {f"l{i}": {"kind": "full_attention", "block_size": 16, "num_kv_heads": 2,
                             "head_size": 64} for i in range(4)},
        "model": {"max_model_len": 1024}, "device": {"available_bytes": 2**30},
    })
    ours: LayerSpec = request.layers["l0"]
    engine = {name: fresh_layer_spec(spec, 0) for name, spec in request.layers.items()}
    engine["l3"] = dataclasses.replace(engine["l3"], is_draft=True)  # not in vLLM's equality
    assert engine["l0"] == engine["l3"]
    builder = SpecBuilder(0, engine)
    for name in engine:
        assert builder.layer(name, ours) is engine[name]
    assert builder.layer("l3", ours).is_draft
    assert not builder.layer("l0", ours).is_draft
    assert builder.layer("not an engine layer", ours) == engine["l0"]
