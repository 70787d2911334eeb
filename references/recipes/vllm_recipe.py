"""hisparse_plan inside vLLM 0.33 or 0.34 on a CPU machine: vLLM's own planner and
hisparse_plan's, on vLLM's own objects, and the builder plugged in. Prints what it checks.

Run it in vLLM's venv, the project on PYTHONPATH (or installed there with --no-deps):

    PYTHONPATH=src /work/vllm-venv/bin/python references/recipes/vllm_recipe.py
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# vLLM's CPU platform, and no network: only the model's config.json is read.
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
import vllm  # type: ignore[import-not-found, unused-ignore]
from vllm.config import KVTransferConfig, ModelConfig, VllmConfig  # type: ignore[import-not-found, unused-ignore]
from vllm.config.attention import HiSparseConfig  # type: ignore[import-not-found, unused-ignore]
from vllm.v1.core import kv_cache_planning  # type: ignore[import-not-found, unused-ignore]
from vllm.v1.kv_cache_interface import FullAttentionSpec  # type: ignore[import-not-found, unused-ignore]

import hisparse_plan as hp
from hisparse_plan.adapters.vllm import (
    BUILDER_QUALNAME,
    PLUGIN_SWITCH,
    hisparse_off_cuda,
    install_builder,
    register,
    request_from_vllm,
    to_kv_cache_config,
)
from hisparse_plan.adapters.vllm.specs import fresh_layer_spec
from hisparse_plan.adapters.vllm.types import VllmObject
from hisparse_plan.presets import Settings, build_request, load_preset

GIB = 2**30
MODEL = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
    "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2,
    "num_hidden_layers": 2, "vocab_size": 1000, "max_position_embeddings": 8192,
    "torch_dtype": "bfloat16", "rms_norm_eps": 1e-5, "head_dim": 64,
}


@contextlib.contextmanager
def triton_check_satisfied() -> Iterator[None]:
    """vLLM 0.34's CPU platform refuses x86 without Triton while it builds a config ("vLLM on
    x86 CPUs requires Triton"); planning never runs Triton, so say yes while building."""
    triton_utils: Any = importlib.import_module("vllm.triton_utils")
    saved = triton_utils.HAS_TRITON
    triton_utils.HAS_TRITON = True
    try:
        yield
    finally:
        triton_utils.HAS_TRITON = saved


def cpu_config(model_dir: Path) -> VllmObject:
    """A real VllmConfig on CPU, with a resolved KV cache layout (the planners read it)."""
    (model_dir / "config.json").write_text(json.dumps(MODEL))
    with triton_check_satisfied():
        model = ModelConfig(model=str(model_dir), max_model_len=4096, skip_tokenizer_init=True)
        config = VllmConfig(model_config=model)
    config.cache_config.kv_cache_layout = "NHD"
    return config


def vllm_plans(
    config: VllmObject, specs: dict[str, VllmObject], available_bytes: int
) -> VllmObject:
    """vLLM's engine flow: the global groups first, then one KVCacheConfig per worker."""
    groups = kv_cache_planning.get_global_kv_cache_groups(config, [specs])
    return kv_cache_planning.get_kv_cache_configs(config, [specs], [available_bytes], groups)[0]


def with_hisparse(
    config: VllmObject, device_buffer_size: int, host_pool_gib: float
) -> VllmObject:
    """The config with HiSparse switched on after it was built: VllmConfig's own check, run
    while building, refuses HiSparse off CUDA ("The current platform does not support
    HiSparse"), and the planners never ask the platform again."""
    hisparse = copy.deepcopy(config)
    hisparse.attention_config.hisparse_config = HiSparseConfig(
        device_buffer_size=device_buffer_size)
    hisparse.kv_transfer_config = KVTransferConfig(
        kv_connector="HiSparseConnector", kv_role="kv_both",
        kv_connector_extra_config={"host_pool_gib": host_pool_gib})
    return hisparse


def hisparse_worker_specs(
    config: VllmObject, specs: dict[str, VllmObject]
) -> dict[str, VllmObject]:
    """What a HiSparse worker registers: its layers' specs and the resident and hot specs
    HiSparse derives from them (a worker's `resolve_hisparse_specs` adds them; it needs the
    attention layers, so here they come from vLLM's grouping of the same specs)."""
    layout: Any = importlib.import_module("vllm.v1.hisparse.layout")
    derived = {
        name: group.kv_cache_spec
        for group in layout.get_hisparse_kv_cache_groups(config, specs)
        if type(group.kv_cache_spec).__name__ in ("HiSparseResidentSpec", "HiSparseHotSpec")
        for name in group.layer_names
    }
    return specs | derived


def uninstall_builder() -> None:
    """Undo install_builder, so the plugin step below starts from vLLM's own choice."""
    platform = importlib.import_module("vllm.platforms").current_platform
    del type(platform).get_kv_cache_config_builder_cls


def main() -> None:
    print(f"vLLM {vllm.__version__}, torch {torch.__version__}")
    with tempfile.TemporaryDirectory() as model_dir:
        config = cpu_config(Path(model_dir))
    block = config.cache_config.block_size or 16
    specs = {
        f"model.layers.{index}.self_attn.attn": FullAttentionSpec(
            block_size=block, num_kv_heads=2, head_size=64, dtype=torch.bfloat16)
        for index in range(2)
    }
    available = GIB

    # 1. vLLM's own planner, then hisparse_plan on the same objects.
    own = vllm_plans(config, specs, available)
    request = request_from_vllm(specs, config, available)
    plan = hp.plan(request)
    retention = config.cache_config.prefix_cache_retention_interval
    ours = to_kv_cache_config(plan, specs, prefix_cache_retention_interval=retention)
    print(f"num_blocks: vLLM {own.num_blocks}, hisparse_plan {plan.num_blocks}")
    print(f"to_kv_cache_config(plan) == vLLM's KVCacheConfig: {ours == own}")

    # 2. The builder plugged in by hand: vLLM's flow now plans through hisparse_plan.
    install_builder()
    plugged = vllm_plans(config, specs, available)
    print(f"builder installed by hand ({BUILDER_QUALNAME.rsplit('.', 1)[1]}): "
          f"same config {plugged == own}")

    uninstall_builder()

    # 3. The general plugin: vLLM calls register() in every process; it installs the builder
    #    only when HISPARSE_PLAN_VLLM_BUILDER=1.
    os.environ[PLUGIN_SWITCH] = "1"
    register()
    platform = importlib.import_module("vllm.platforms").current_platform
    chosen = platform.get_kv_cache_config_builder_cls(config)
    print(f"plugin with {PLUGIN_SWITCH}=1 chooses hisparse_plan's builder: "
          f"{chosen == BUILDER_QUALNAME}")
    uninstall_builder()

    # 4. HiSparse on a CPU machine: a DeepSeek-V3.2 worker's specs (from the preset; a real
    #    worker gets them from its model), HiSparse switched on after the config is built.
    preset = build_request(load_preset("deepseek-v3.2").architecture,
                           Settings(max_model_len=4096, block_size=64))
    sparse_specs = {name: fresh_layer_spec(layer, 0) for name, layer in preset.layers.items()}
    sparse_config = with_hisparse(config, 2048, 8.0)
    sparse_config.model_config.hf_config.index_topk = preset.model.index_topk
    # Sparse MLA's pages of several sizes pack into one block only in a block-major layout.
    sparse_config.cache_config.kv_cache_layout = preset.device.kv_cache_layout.value
    #    Off CUDA, vLLM has no HiSparse backend to ask whether the host pool is shared:
    #    hisparse_off_cuda answers for it (False: one host pool per rank, as at TP 1).
    with hisparse_off_cuda(shared_host_pool=False):
        sparse_specs = hisparse_worker_specs(sparse_config, sparse_specs)
        sparse_own = vllm_plans(sparse_config, sparse_specs, 8 * GIB)
        sparse_plan = hp.plan(request_from_vllm(sparse_specs, sparse_config, 8 * GIB))
    sparse_ours = to_kv_cache_config(
        sparse_plan, sparse_specs, prefix_cache_retention_interval=retention)
    print(f"HiSparse: host pool blocks vLLM {sparse_own.hisparse_host_num_blocks}, "
          f"hisparse_plan {sparse_plan.host_pool.num_blocks if sparse_plan.host_pool else None}; "
          f"same config {sparse_ours == sparse_own}")
    if not (ours == own and plugged == own and chosen == BUILDER_QUALNAME
            and sparse_ours == sparse_own):
        raise SystemExit("FAIL: hisparse_plan and vLLM disagree")
    print("PASS")


if __name__ == "__main__":
    main()
