"""vLLM 0.34's own plan of an encoder-decoder model's caches (Whisper), the figures
tests/targets/vllm/test_cross_attention.py pins. Needs vLLM (run it in the vLLM venv, this
checkout's sources
first):

    PYTHONPATH=src /work/vllm-venv/bin/python references/vllm_cross_attention.py \
        [CONFIG] [--memory BYTES] [--layout BLNHC] [--no-hybrid]

The config (default: tests/hf_configs/whisper-small/config.json) is built with vLLM's model class
on the meta device (`adapters.vllm.meta_model`: WhisperForConditionalGeneration's self-attention
FullAttentionSpec and cross-attention CrossAttentionSpec layers), and vLLM's engine config for it
is vLLM's own (`EngineArgs` on the model folder: the scheduler's encoder-decoder settings,
`max_num_encoder_input_tokens`, the block size). vLLM's planner then groups and sizes the layers
(`get_global_kv_cache_groups`, `get_kv_cache_configs`) for BYTES of KV memory on one worker; the
groups, the tensors, `num_blocks`, each group's blocks per request and the max concurrency are
printed as JSON, or what vLLM raised (with the hybrid manager disabled it refuses the model).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
WHISPER = REPO / "tests" / "hf_configs" / "whisper-small" / "config.json"


def vllm_plan(config: dict[str, Any], memory: int, layout: str, hybrid: bool) -> dict[str, Any]:
    from vllm.v1.core import kv_cache_planning as planning  # type: ignore[import-not-found, unused-ignore]
    from vllm.v1.core.kv_cache_utils import (  # type: ignore[import-not-found, unused-ignore]
        get_max_concurrency_for_kv_cache_config,
    )

    from hisparse_plan.adapters.vllm import meta_model

    length = config.get("max_target_positions", 448)
    meta = meta_model.kv_cache_specs(config, max_model_len=length)
    with tempfile.TemporaryDirectory() as folder, meta_model._platform():
        (Path(folder) / "config.json").write_text(json.dumps(config))
        vllm_config = meta_model._engine_config(folder, length, "auto")
    scheduler = vllm_config.scheduler_config
    vllm_config.cache_config.kv_cache_layout = layout
    scheduler.disable_hybrid_kv_cache_manager = not hybrid
    answer: dict[str, Any] = {
        "vllm": meta.vllm_version, "max_model_len": length,
        "max_num_batched_tokens": scheduler.max_num_batched_tokens,
        "max_num_encoder_input_tokens": scheduler.max_num_encoder_input_tokens,
        "block_size": vllm_config.cache_config.block_size, "layout": layout, "memory": memory,
    }
    specs = dict(meta.specs)
    try:
        groups = planning.get_global_kv_cache_groups(vllm_config, [specs])
        (kv_config,) = planning.get_kv_cache_configs(vllm_config, [specs], [memory], groups)
    except (ValueError, NotImplementedError, AssertionError) as error:
        return {**answer, "refused": f"{type(error).__name__}: {error}"}
    answer["groups"] = [{
        "kind": type(group.kv_cache_spec).__name__, "layers": list(group.layer_names),
        "page_size_bytes": group.kv_cache_spec.page_size_bytes,
        "blocks_per_request": -(-group.kv_cache_spec.max_memory_usage_bytes(vllm_config)
                                // group.kv_cache_spec.page_size_bytes),
    } for group in kv_config.kv_cache_groups]
    answer["num_blocks"] = kv_config.num_blocks
    answer["tensors"] = [{"size": t.size, "layers": list(t.layers), "offset": t.offset,
                          "layer_stride": t.layer_stride, "block_stride": t.block_stride}
                         for t in kv_config.kv_cache_tensors]
    answer["max_concurrency"] = get_max_concurrency_for_kv_cache_config(vllm_config, kv_config)
    return answer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", type=Path, default=WHISPER)
    parser.add_argument("--memory", type=int, default=2**30, help="KV cache bytes (1 GiB)")
    parser.add_argument("--layout", default="BLNHC", help="vLLM's kv_cache_layout")
    parser.add_argument("--no-hybrid", action="store_true",
                        help="disable the hybrid KV cache manager")
    args = parser.parse_args()
    config = json.loads(args.config.read_text())
    print(json.dumps(vllm_plan(config, args.memory, args.layout, not args.no_hybrid), indent=1))


if __name__ == "__main__":
    main()
