"""`--gpu` decides the device layout as vLLM 0.34 resolves it on that GPU; an explicit
`--layout` vLLM refuses is refused; `explain` says which backends and layout were taken; and
with the KV-cache bytes given, `--gpu` needs no weights to fit."""

from __future__ import annotations

import json

import pytest

from hisparse_plan.presets.hardware import find_gpu
from support.cli_support import Run

CAPABILITY = {"a100-80gb": (8, 0), "l40s": (8, 9), "h100": (9, 0), "h200": (9, 0),
              "b200": (10, 0), "gb200": (10, 0), "rtx-pro-6000": (12, 0)}


def layout(cli: Run, *argv: str) -> str:
    code, out, err = cli("plan", *argv, "--kv-cache-memory", "60GiB", "--json")
    assert code == 0, err
    body = json.loads(out)
    return str(body.get("plan", body)["device_pools"][0]["layout"])


@pytest.mark.parametrize(("gpu", "capability"), CAPABILITY.items())
def test_every_capability_vllm_tells_apart_has_a_gpu_name(gpu: str,
                                                          capability: tuple[int, int]) -> None:
    assert find_gpu(gpu).compute_capability == capability


@pytest.mark.parametrize(("model", "gpu", "expected"), [
    ("llama-3-8b", "h100", "LBNHC"),          # FlashAttention declares nothing
    ("llama-3-8b", "b200", "LBHNC"),          # FlashInfer's trtllm-gen kernels on 10.x
    ("gpt-oss-120b", "gb200", "LBHNC"),
    ("gemma-3-27b", "l40s", "LBNHC"),
    ("deepseek-v3.2", "h200", "BLHNC"),       # the HiSparse connector's
    ("deepseek-v4-flash", "rtx-pro-6000", "BLHNC"),  # its indexer's first
])
def test_the_layout_follows_the_gpu(cli: Run, model: str, gpu: str, expected: str) -> None:
    assert layout(cli, model, "--gpu", gpu) == expected


def test_without_hisparse_a_sparse_mla_model_is_planned_layer_outermost(cli: Run) -> None:
    assert layout(cli, "deepseek-v3.2", "--no-hisparse") == "LBNHC"


@pytest.mark.parametrize(("argv", "words"), [
    (("llama-3-8b", "--gpu", "b200", "--layout", "LBNHC"), "valid layouts: ['LBHNC', 'BLHNC']"),
    (("llama-3-8b", "--gpu", "l40s", "--layout", "LHBNC", "--kv-cache-dtype", "fp8"),
     "VLLM_KV_CACHE_LAYOUT=LHBNC does not satisfy"),  # FlashInfer, for fp8 on 8.9
    (("deepseek-v4-flash", "--layout", "LBHNC"), "valid layouts: ['BLHNC', 'BLNHC']"),
    (("deepseek-v3.2", "--no-hisparse", "--gpu", "rtx-pro-6000", "--layout", "BLNHC"),
     "block stride 3076352 bytes is not a multiple of 656 bytes"),
])
def test_a_layout_vllm_or_a_kernel_refuses_is_refused(cli: Run, argv: tuple[str, ...],
                                                      words: str) -> None:
    code, _, err = cli("plan", *argv, "--kv-cache-memory", "60GiB")
    assert code != 0
    assert words in err


def test_explain_names_the_backends_and_the_layout(cli: Run) -> None:
    code, out, err = cli("explain", "gpt-oss-120b", "--gpu", "b200", "--section", "backends",
                         "--plain")
    assert code == 0, err
    assert "FLASHINFER" in out
    assert "LBHNC" in out
    assert "10.0" in out


def test_with_the_kv_cache_bytes_given_the_weights_need_not_fit(cli: Run) -> None:
    code, _, err = cli("plan", "deepseek-v3.2", "--gpu", "h100")
    assert code != 0
    assert "leaves no KV cache" in err
    assert layout(cli, "deepseek-v3.2", "--gpu", "h100") == "BLHNC"
    assert layout(cli, "deepseek-v3.2", "--gpu", "h100", "--no-hisparse") == "LBNHC"
