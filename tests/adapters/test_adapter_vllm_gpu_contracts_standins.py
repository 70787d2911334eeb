"""The builder's stride check (adapters/vllm/kernel_contracts.py) without vLLM: stand-ins for
what the builder's call reaches of vLLM (a `vllm_config` whose compilation config holds the
registered attention layers, each answering a backend class by its vLLM name) and the builder's
placement of DeepSeek-V3.2 (fp8_ds_mla, 64-token blocks, no HiSparse).

Expected verdicts worked out here: BLNHC puts a block's 61 x (64 x 656 latent + 64 x 132
indexer) bytes back to back, 3,076,352 bytes = 4,689 rows of 656 and 368 bytes over, and a
multiple of 256; with 16-token LBNHC blocks an indexer block is 16 x 132 = 2,112 bytes, 8 x 256
and 64 over, and a latent block 16 x 656."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

import hisparse_plan as hp
from hisparse_plan.adapters.vllm.kernel_contracts import check_placed_strides
from hisparse_plan.models import KVCacheLayout, PlanRequest
from hisparse_plan.presets import Settings, build_request, load_preset

V32 = load_preset("deepseek-v3.2").architecture
LLAMA = load_preset("llama-3-8b").architecture


def backend(name: str) -> type:
    """A backend class as vLLM's: `get_name()` answers its registry name."""
    return type(name.title(), (), {"get_name": staticmethod(lambda: name)})


class Layer:
    """An attention layer as vLLM registers it: `get_attn_backend()` answers its class."""

    def __init__(self, name: str) -> None:
        self.backend = backend(name)

    def get_attn_backend(self) -> type:
        return self.backend


def engine(request: PlanRequest, latent: str | None) -> Any:
    """A vllm_config whose model registered its layers (`latent`'s backend for the latent
    layers, the indexer's own for the indexers), or none (`latent` None)."""
    context = {} if latent is None else {
        name: Layer("DEEPSEEK_V32_INDEXER" if "indexer" in name else latent)
        for name in request.layers
    }
    return SimpleNamespace(compilation_config=SimpleNamespace(static_forward_context=context))


def placed(layout: KVCacheLayout, **settings: Any) -> tuple[PlanRequest, hp.KVCachePlan]:
    request = build_request(V32, Settings(hisparse=False, layout=layout, **settings))
    return request, hp.plan(request)


def check(request: PlanRequest, plan: hp.KVCachePlan, latent: str | None,
          capability: tuple[int, int] | None) -> None:
    check_placed_strides(engine(request, latent), request.layers, plan.tensors, capability)


def test_the_worked_numbers() -> None:
    assert 61 * (64 * 656 + 64 * 132) == 3_076_352 == 4689 * 656 + 368 == 12_017 * 256
    assert 16 * 132 == 2112 == 8 * 256 + 64


@pytest.mark.parametrize("capability", [None, (12, 0)])
def test_a_registered_flat_row_backend_refuses_the_block_outermost_latent(
        capability: tuple[int, int] | None) -> None:
    request, plan = placed(KVCacheLayout.BLNHC)
    with pytest.raises(hp.PlanError, match=(
            r"refused before vLLM allocates it \(vLLM's FLASHINFER_MLA_SPARSE_SM120 backend, as "
            r"vLLM registered the layer.*\): model\.layers\.0\.self_attn\.attn: block stride "
            r"3076352 bytes is not a multiple of 656 bytes, which flat_kv_row_view")):
        check(request, plan, "FLASHINFER_MLA_SPARSE_SM120", capability)


@pytest.mark.parametrize("capability", [None, (9, 0), (10, 0)])
def test_a_registered_paged_backend_holds_the_same_placement(
        capability: tuple[int, int] | None) -> None:
    request, plan = placed(KVCacheLayout.BLNHC)
    check(request, plan, "FLASHMLA_SPARSE", capability)


def test_without_registered_layers_the_gpu_selects_the_backend() -> None:
    request, plan = placed(KVCacheLayout.BLNHC)
    with pytest.raises(hp.PlanError, match=(
            r"FLASHINFER_MLA_SPARSE_SM120 backend, as vLLM 0\.34 selects it on compute "
            r"capability 12\.0\).*3076352 bytes is not a multiple of 656 bytes")):
        check(request, plan, None, (12, 0))
    for capability in ((9, 0), (10, 0), None):  # FlashMLA's pages, or no GPU known
        check(request, plan, None, capability)


def test_the_indexer_rule_needs_a_deep_gemm_gpu() -> None:
    request, plan = placed(KVCacheLayout.LBNHC, block_size=16)
    for latent in ("FLASHMLA_SPARSE", None):
        with pytest.raises(hp.PlanError, match=(
                r"model\.layers\.0\.self_attn\.indexer\.k_cache: block stride 2112 bytes is "
                r"not a multiple of 256 bytes, which sparse_mqa_logits_paged_decode")):
            check(request, plan, latent, (10, 0))
        check(request, plan, latent, (12, 0))
        check(request, plan, latent, None)


def test_a_model_without_sparse_mla_holds_no_contract() -> None:
    request = build_request(LLAMA, Settings(layout=KVCacheLayout.BLNHC))
    plan = hp.plan(request)
    context = {name: Layer("FLASH_ATTN") for name in request.layers}
    config = SimpleNamespace(compilation_config=SimpleNamespace(static_forward_context=context))
    for capability in ((9, 0), (12, 0), None):
        check_placed_strides(config, request.layers, plan.tensors, capability)
