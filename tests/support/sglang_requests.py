"""SGLang requests and plan lookups the tests build by hand: layers of each kind, a request around
them, a golden request's layers for SGLang."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

from hisparse_plan.models.plan import KVCacheTensor
from hisparse_plan.models.pools import Pool
from hisparse_plan.models.request import PlanRequest
from hisparse_plan.models.sglang_plan import SGLangPlan
from support.golden import GOLDEN

BIG = 1 << 40


GIB = 1 << 30


def mha(heads: int = 8, head: int = 128, dtype: str = "bfloat16", **extra: Any) -> dict[str, Any]:
    return {"kind": "full_attention", "block_size": 16, "num_kv_heads": heads,
            "head_size": head, "dtype": dtype, **extra}


def swa(window: int, heads: int = 8, head: int = 128) -> dict[str, Any]:
    return {"kind": "sliding_window", "block_size": 16, "num_kv_heads": heads,
            "head_size": head, "dtype": "bfloat16", "sliding_window": window}


def latent(dtype: str = "bfloat16", **extra: Any) -> dict[str, Any]:
    return {"kind": "mla", "block_size": 64, "head_size": 576, "dtype": dtype, **extra}


DSA_ROW = latent("uint8", cache_dtype="fp8_ds_mla", state_content_bytes=656)


INDEXER = {"kind": "mla", "block_size": 64, "head_size": 132, "dtype": "uint8",
           "cache_role": "indexer"}


def dsa_layers(n: int) -> dict[str, Any]:
    layers: dict[str, Any] = {}
    for i in range(n):
        layers[f"l{i}.attn"] = DSA_ROW
        layers[f"l{i}.indexer"] = INDEXER
    return layers


def request(
    layers: dict[str, Any], available: int = BIG, **engine: Any
) -> PlanRequest:
    engine.setdefault("context_length", 4096)
    return PlanRequest.model_validate({
        "layers": layers,
        "model": {"max_model_len": engine["context_length"]},
        "device": {"available_bytes": available},
        "engine": {"name": "sglang", **engine},
    })


def golden(name: str, **engine: Any) -> PlanRequest:
    """A golden request's layers for SGLang (its vLLM-only HiSparse section dropped)."""
    data = json.loads((GOLDEN / f"{name}.request.json").read_text())
    data["hisparse"] = None
    data["engine"] = {"name": "sglang", **engine}
    return PlanRequest.model_validate(data)


def pool(plan: SGLangPlan, name: str) -> Pool:
    return next(p for p in plan.pools if p.name == name)


def tensor(plan: SGLangPlan, name: str) -> KVCacheTensor:
    return next(t for t in plan.tensors if t.pool == name)


def mamba(dim: int = 1024, kernel: int = 4) -> dict[str, Any]:
    return {"kind": "mamba", "block_size": 4096, "state_shapes": [[kernel - 1, dim], [8, 64, 128]],
            "state_dtypes": ["bfloat16", "bfloat16"]}


@st.composite
def small_requests(draw: st.DrawFn) -> PlanRequest:
    family = draw(st.sampled_from(["mha", "swa", "mla", "dsa", "hisparse"]))
    n = draw(st.integers(1, 3))
    page = 64 if family in ("dsa", "hisparse") else draw(st.sampled_from([1, 4, 16]))
    engine: dict[str, Any] = {"page_size": page, "context_length": draw(st.integers(1, 512)),
                              "max_total_tokens": page * draw(st.integers(2, 12))}
    dtype = draw(st.sampled_from(["bfloat16", "float16", "uint8"]))
    layers: dict[str, Any]
    if family in ("mha", "swa"):
        heads, head = draw(st.integers(1, 4)), draw(st.sampled_from([8, 16, 64]))
        head_v = draw(st.sampled_from([head, head // 2]))
        layers = {f"f{i}": mha(heads, head, dtype, head_size_v=head_v) for i in range(n)}
        if family == "swa":
            window = draw(st.integers(1, 16))
            layers.update({f"w{i}": swa(window, heads, head) for i in range(n)})
            engine["max_total_tokens"] = 64 * page
            engine["swa_full_tokens_ratio"] = 0.75
    elif family == "mla":
        layers = {f"m{i}": latent(dtype) for i in range(n)}
    else:
        layers = dsa_layers(n)
        engine["dsa_backend"] = draw(st.sampled_from(["flashmla_kv", "trtllm"]))
        if family == "hisparse":
            engine["enable_hisparse"] = True
            engine["hisparse_top_k"] = 64
            engine["hisparse_host_to_device_ratio"] = draw(st.integers(1, 3))
    return request(layers, **engine)
