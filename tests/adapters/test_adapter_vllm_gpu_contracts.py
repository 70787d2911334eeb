"""The kernels' stride rules inside vLLM 0.34. The builder plugged into vLLM refuses, while
vLLM plans, a placement the kernels of the backends vLLM selected would assert against
(vllm#55431), instead of handing vLLM a KV cache config its workers crash on; it holds the same
placement where the backend reads pages. And `request_from_vllm` names the GPU vLLM's platform
reports, so `plan()` holds the plan to its kernels' rules.

vLLM's planner runs on CPU on a real `VllmConfig` (see `vllm_support`), for DeepSeek-V3.2
(fp8_ds_mla, 64-token blocks, no HiSparse) asked for BLNHC, a layout vLLM 0.34 accepts. One
block there is every layer's pages back to back: 61 x (64 x 656 latent + 64 x 132 indexer) =
3,076,352 bytes, 4,689 rows of 656 bytes and 368 bytes over, and 12,017 x 256 bytes exactly.

The backends are read as the builder reads them inside vLLM: from the attention layers vLLM
registers in `compilation_config.static_forward_context` (here objects of vLLM's own
`AttentionLayerBase` answering vLLM's own backend classes, as a model's layers do), else from
the GPU the platform reports (here vLLM's CPU platform standing in for a CUDA one, answering
`is_cuda` and `get_device_capability`).
"""

from __future__ import annotations

import importlib
from typing import Any

import pytest

pytest.importorskip("vllm")

import hisparse_plan as hp
from hisparse_plan.adapters.vllm import BUILDER_QUALNAME, request_from_vllm
from hisparse_plan.models import KVCacheLayout
from hisparse_plan.presets import Settings, build_request, load_preset
from support import vllm_support as vs

planning = importlib.import_module("vllm.v1.core.kv_cache_planning")
layer_base = importlib.import_module("vllm.model_executor.layers.attention_layer_base")
platforms = importlib.import_module("vllm.platforms")
interface = importlib.import_module("vllm.platforms.interface")
SM120 = importlib.import_module(
    "vllm.v1.attention.backends.mla.flashinfer_mla_sparse").FlashInferMLASparseSM120Backend
FLASHMLA = importlib.import_module(
    "vllm.v1.attention.backends.mla.flashmla_sparse").FlashMLASparseBackend
INDEXER = importlib.import_module(
    "vllm.v1.attention.backends.mla.indexer").DeepseekV32IndexerBackend

V32 = load_preset("deepseek-v3.2").architecture
BLOCK_STRIDE = 61 * (64 * 656 + 64 * 132)
FIRST_LATENT = "model.layers.0.self_attn.attn"


class Registered(layer_base.AttentionLayerBase):  # type: ignore[misc, name-defined]
    """An attention layer as vLLM registers it, answering the backend vLLM selected for it."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend

    def get_attn_backend(self) -> Any:
        return self.backend

    def get_kv_cache_spec(self, vllm_config: Any) -> None:
        return None


def v32_inputs(layout: KVCacheLayout) -> vs.VllmInputs:
    request = build_request(V32, Settings(hisparse=False, layout=layout))
    return vs.vllm_inputs(request.model_dump(mode="json"))


def register(inputs: vs.VllmInputs, latent: Any) -> None:
    """The model's layers, as vLLM registers them when it builds the model in this process."""
    context = inputs.config.compilation_config.static_forward_context
    for name, spec in inputs.specs.items():
        role = getattr(getattr(spec, "cache_role", None), "value", None)
        context[name] = Registered(INDEXER if role == "indexer" else latent)


@pytest.fixture
def cuda(monkeypatch: pytest.MonkeyPatch) -> Any:
    """A setter: the platform reports a CUDA GPU of the given compute capability."""
    platform_cls = type(platforms.current_platform)

    def on(major: int, minor: int) -> None:
        answer = interface.DeviceCapability(major, minor)
        monkeypatch.setattr(platform_cls, "is_cuda", lambda self: True)
        monkeypatch.setattr(platform_cls, "get_device_capability",
                            classmethod(lambda cls, device_id=0: answer))

    return on


def test_vllm_itself_accepts_the_placement_its_sm120_kernel_asserts_on() -> None:
    """The crash the builder prevents: vLLM 0.34's own builder plans it, 3,076,352 B apart."""
    inputs = v32_inputs(KVCacheLayout.BLNHC)
    register(inputs, SM120)
    config = vs.engine_configs(inputs)[0]
    latent = next(t for t in config.kv_cache_tensors if FIRST_LATENT in t.layers)
    assert latent.block_stride == BLOCK_STRIDE == 3_076_352
    assert BLOCK_STRIDE % 656 == 368


def test_the_builder_refuses_what_the_registered_sm120_backend_would_assert_on() -> None:
    inputs = v32_inputs(KVCacheLayout.BLNHC)
    register(inputs, SM120)
    with pytest.raises(hp.PlanError, match=(
            r"FLASHINFER_MLA_SPARSE_SM120 backend, as vLLM registered the layer\): "
            r"model\.layers\.\d+\.self_attn\.attn: block stride 3076352 bytes is not a "
            r"multiple of 656 bytes.*flat_kv_row_view")):
        vs.plugged_configs(inputs)


def test_the_builder_keeps_what_the_registered_paged_backend_reads() -> None:
    """FlashMLA reads fp8_ds_mla as 64-token pages, not flat rows: vLLM's own configs."""
    inputs = v32_inputs(KVCacheLayout.BLNHC)
    register(inputs, FLASHMLA)
    ours = vs.plugged_configs(inputs)
    assert [vs.canonical(config) for config in ours] == [
        vs.canonical(config) for config in vs.engine_configs(inputs)]


def test_without_registered_layers_the_builder_selects_for_the_platforms_gpu(cuda: Any) -> None:
    """An engine core whose workers run elsewhere holds no layers: the GPU decides."""
    inputs = v32_inputs(KVCacheLayout.BLNHC)
    assert not inputs.config.compilation_config.static_forward_context
    cuda(12, 0)
    with pytest.raises(hp.PlanError, match=(
            r"FLASHINFER_MLA_SPARSE_SM120 backend, as vLLM 0\.34 selects it on compute "
            r"capability 12\.0\).*3076352 bytes is not a multiple of 656 bytes")):
        vs.plugged_configs(inputs)
    cuda(9, 0)  # FlashMLA's pages; the indexer's 3,076,352 B are 12,017 x 256
    assert BLOCK_STRIDE % 256 == 0
    assert len(vs.plugged_configs(inputs)) == 1


def test_the_builder_refuses_an_indexer_stride_deep_gemm_misreads(cuda: Any) -> None:
    """16-token blocks, layer-outermost: an indexer block is 16 x 132 = 2,112 B, 8 x 256 + 64."""
    request = build_request(V32, Settings(hisparse=False, block_size=16,
                                          layout=KVCacheLayout.LBNHC))
    inputs = vs.vllm_inputs(request.model_dump(mode="json"))
    register(inputs, FLASHMLA)
    cuda(10, 0)
    with pytest.raises(hp.PlanError, match=(
            r"indexer\.k_cache: block stride 2112 bytes is not a multiple of 256 bytes.*"
            r"sparse_mqa_logits")):
        vs.plugged_configs(inputs)


def test_the_worker_profiling_call_is_refused_too() -> None:
    """A worker builds a minimal KV cache to profile CUDA graphs through the same hook."""
    inputs = v32_inputs(KVCacheLayout.BLNHC)
    register(inputs, SM120)
    builder = importlib.import_module("hisparse_plan.adapters.vllm.builder")
    with vs.vllm_world(BUILDER_QUALNAME, inputs.shared_host_pool):
        groups = planning.get_global_kv_cache_groups(inputs.config, [dict(inputs.specs)])
        with pytest.raises(hp.PlanError, match="3076352 bytes is not a multiple of 656"):
            builder.HisparsePlanKVCacheConfigBuilder().get_kv_cache_config_from_groups(
                inputs.config, groups, 1)


def test_request_from_vllm_names_the_platforms_gpu(cuda: Any) -> None:
    inputs = v32_inputs(KVCacheLayout.BLNHC)
    request = request_from_vllm(inputs.specs, inputs.config, inputs.available_bytes)
    assert request.device.compute_capability is None  # vLLM's CPU platform: no GPU
    hp.plan(request)
    cuda(12, 0)
    request = request_from_vllm(inputs.specs, inputs.config, inputs.available_bytes)
    assert request.device.compute_capability == (12, 0)
    with pytest.raises(hp.PlanError, match="3076352 bytes is not a multiple of 656 bytes"):
        hp.plan(request)
