"""DeepSeek-V4-Flash in vLLM 0.33 and in hisparse_plan, side by side. Needs vLLM (run it in the
vLLM venv, with this checkout's sources first):

    PYTHONPATH=src /work/vllm-venv/bin/python references/vllm_v4_flash.py [--layout BLNHC]

A real DeepSeek-V4 model cannot be built on a CPU box, so its KV cache layers are made one by one
with vLLM's own classes (`DeepseekV4SWACache`, `DeepseekV4IndexerCache`, `CompressorStateCache`,
and `DeepseekV4Attention.get_kv_cache_spec` on a stand-in carrying the fields it reads), in the
order `DeepseekV4Attention.__init__` registers them, from the preset's config.json fields read by
transformers' `DeepseekV4Config`. Each spec then goes through the worker's
`customize_attention_spec` with its layer's backend (the CUDA FlashMLA ones), the block size is
vLLM's `Platform._preferred_block_size_for_backends` over those backends, and the layout (unless
given) its `resolve_kv_cache_layout`. vLLM's planner runs on the specs; the preset's request must
hold the same layers, and its plan must be vLLM's KVCacheConfig field for field (a kernel block of
the whole 256-token block, `MultipleOf(256)`, and the fp8 quantization mode move no byte; the
request contract has neither, so they are compared without them).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import types
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
# The DeepSeek-V4 package imports its vision tower, which needs einops; no byte of it is used.
sys.modules.setdefault("einops", types.ModuleType("einops"))

import torch  # noqa: E402
import vllm.config.vllm as vllm_config_module  # type: ignore[import-not-found, unused-ignore]  # noqa: E402
from transformers.models.deepseek_v4.configuration_deepseek_v4 import (  # type: ignore[import-not-found, unused-ignore]  # noqa: E402
    DeepseekV4Config,
)
from vllm.models.deepseek_v4.attention import (  # type: ignore[import-not-found, unused-ignore]  # noqa: E402
    DeepseekV4Attention,
    DeepseekV4IndexerCache,
    _resolve_dsv4_kv_cache_dtype,
)
from vllm.models.deepseek_v4.compressor import (  # type: ignore[import-not-found, unused-ignore]  # noqa: E402
    CompressorStateCache,
)
from vllm.models.deepseek_v4.nvidia.flashmla import (  # type: ignore[import-not-found, unused-ignore]  # noqa: E402
    DeepseekSparseSWAFlashMLABackend,
    DeepseekV4FlashMLAAttention,
)
from vllm.platforms.interface import Platform  # type: ignore[import-not-found, unused-ignore]  # noqa: E402
from vllm.v1.attention.backends import utils as backend_utils  # type: ignore[import-not-found, unused-ignore]  # noqa: E402
from vllm.v1.attention.backends.mla.sparse_swa import (  # type: ignore[import-not-found, unused-ignore]  # noqa: E402
    DeepseekV4SWACache,
)
from vllm.v1.kv_cache_interface import AttentionSpec, KVQuantMode  # type: ignore[import-not-found, unused-ignore]  # noqa: E402
from vllm.v1.worker.utils import customize_attention_spec  # type: ignore[import-not-found, unused-ignore]  # noqa: E402

import hisparse_plan as hp  # noqa: E402
from hisparse_plan.adapters.vllm import request_from_vllm, to_kv_cache_config  # noqa: E402
from hisparse_plan.adapters.vllm.types import VllmObject  # noqa: E402
from hisparse_plan.presets import Settings, build_request, load_preset  # noqa: E402
from support import vllm_support as vs  # noqa: E402

GIB = 2**30


class AttentionStandIn:
    """The fields of a DeepseekV4Attention that its get_kv_cache_spec reads."""

    is_draft_layer = False

    def __init__(self, ratio: int, kv_dtype: str, torch_dtype: VllmObject, head_dim: int) -> None:
        self.compress_ratio, self.kv_cache_dtype = ratio, kv_dtype
        self.kv_cache_torch_dtype, self.head_dim = torch_dtype, head_dim

    def get_kv_cache_spec(self, vllm_config: VllmObject) -> VllmObject:
        return DeepseekV4Attention.get_kv_cache_spec(self, vllm_config)

    def get_attn_backend(self) -> VllmObject:
        return DeepseekV4FlashMLAAttention.backend_cls


def register_caches(hf: VllmObject, block_size: int) -> VllmObject:
    """A stand-in vLLM config whose forward context holds every KV cache layer of the model."""
    cache = SimpleNamespace(cache_dtype="auto", block_size=block_size, kv_cache_layout=None)
    context: dict[str, Any] = {}
    config = SimpleNamespace(
        compilation_config=SimpleNamespace(static_forward_context=context), cache_config=cache,
        model_config=SimpleNamespace(hf_config=hf), kv_transfer_config=None,
    )
    vllm_config_module._current_vllm_config = config
    for i in range(hf.num_hidden_layers):
        prefix = f"model.layers.{i}.attn"
        ratio = max(1, hf.compress_rates.get(hf.layer_types[i], 0))
        if ratio == 4:  # the indexer is built first: its keys, then its compressor
            DeepseekV4IndexerCache(
                head_dim=hf.index_head_dim + hf.index_head_dim // 128 * 4, dtype=torch.uint8,
                prefix=f"{prefix}.indexer.k_cache", cache_config=cache, compress_ratio=ratio,
            )
            CompressorStateCache(state_dim=4 * hf.index_head_dim, dtype=torch.float32,
                                 compress_ratio=ratio,
                                 prefix=f"{prefix}.indexer.compressor.state_cache")
        kv_dtype, torch_dtype = _resolve_dsv4_kv_cache_dtype(
            DeepseekV4FlashMLAAttention.use_fp8_ds_mla_layout, cache.cache_dtype, cache)
        DeepseekV4SWACache(head_dim=hf.head_dim, window_size=hf.sliding_window,
                           dtype=torch_dtype, prefix=f"{prefix}.swa_cache", cache_config=cache,
                           backend_cls=DeepseekSparseSWAFlashMLABackend)
        context[prefix] = AttentionStandIn(ratio, kv_dtype, torch_dtype, hf.head_dim)
        if ratio > 1:
            overlap = 2 if ratio == 4 else 1
            CompressorStateCache(state_dim=2 * overlap * hf.head_dim, dtype=torch.float32,
                                 compress_ratio=ratio, prefix=f"{prefix}.compressor.state_cache")
    return config


def vllm_specs(hf: VllmObject) -> tuple[dict[str, VllmObject], int, str]:
    """Every layer's spec as the worker reports it, the block size and the resolved layout."""
    probe = register_caches(hf, 16)
    backends: list[Any] = []
    for layer in probe.compilation_config.static_forward_context.values():
        if layer.get_attn_backend() not in backends:
            backends.append(layer.get_attn_backend())
    block_size = Platform._preferred_block_size_for_backends(backends, 16, probe)
    config = register_caches(hf, block_size)
    specs = {}
    for name, layer in config.compilation_config.static_forward_context.items():
        spec = layer.get_kv_cache_spec(config)
        if spec is not None:
            if isinstance(spec, AttentionSpec):
                spec = customize_attention_spec(layer.get_attn_backend(), spec)
            specs[name] = spec
    layouts = [layout.name for layout in backend_utils.get_supported_kv_cache_layouts(backends)]
    layout = backend_utils.resolve_kv_cache_layout(config, [layouts], specs.values())
    return specs, block_size, str(layout.name)


def without_neutral_fields(spec: VllmObject) -> VllmObject:
    changes: dict[str, Any] = {"kv_quant_mode": KVQuantMode.NONE}
    if spec.block_stride_alignment is not None and spec.get_block_stride_alignment() == 1:
        changes["block_stride_alignment"] = None
    return dataclasses.replace(spec, **changes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layout", default=None, help="default: the layout vLLM resolves")
    parser.add_argument("--gpu-mem-gib", type=int, default=60)
    parser.add_argument("--max-model-len", type=int, default=65536)
    args = parser.parse_args()
    preset = load_preset("deepseek-v4-flash")
    hf = DeepseekV4Config.from_dict(preset.architecture.model_dump(exclude_none=True))
    specs, block_size, resolved = vllm_specs(hf)
    layout = args.layout or resolved
    print(f"vLLM: {len(specs)} KV cache layers, block size {block_size}, layout {resolved}")
    request = build_request(preset.architecture, Settings(
        gpu_mem_bytes=args.gpu_mem_gib * GIB, max_model_len=args.max_model_len,
        layout=hp.KVCacheLayout(layout)))
    neutral = {name: without_neutral_fields(spec) for name, spec in specs.items()}
    inputs = vs.vllm_inputs(request.model_dump(mode="json"))
    with vs.vllm_world(vs.DEFAULT_BUILDER, False):
        read_back = request_from_vllm(neutral, inputs.config, request.device.available_bytes)
    print("the preset's layers are the ones vLLM's specs give (names, order, fields):",
          list(read_back.layers.items()) == list(request.layers.items()))
    inputs.specs = specs
    theirs = vs.run_vllm(inputs).configs[0]
    print(f"vLLM plan at {layout}: num_blocks {theirs.num_blocks}")
    for group in theirs.kv_cache_groups:
        spec = group.kv_cache_spec
        print(f"  group: {type(spec).__name__} block {spec.block_size} page "
              f"{spec.page_size_bytes} layers {len(group.layer_names)} ({group.layer_names[0]})")
    for tensor in theirs.kv_cache_tensors:
        print(f"  tensor: {len(tensor.layers)} layers ({tensor.layers[0]}) layer_stride "
              f"{tensor.layer_stride} block_stride {tensor.block_stride} offset {tensor.offset}")
    inputs.specs = neutral
    plain = vs.run_vllm(inputs).configs[0]
    plan = hp.plan(request)
    hp.check_plan(plan, request=request)
    print("hisparse_plan: the same KVCacheConfig, field for field:",
          vs.canonical(to_kv_cache_config(plan, neutral)) == vs.canonical(plain))


if __name__ == "__main__":
    main()
