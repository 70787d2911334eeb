"""Flags that describe the deployment around the cache (context guard, regular planning,
pipeline stages, hardware, speculative decoding), kept apart from `vllm/source.py` so that each
module stays one idea. `vllm/source.py` calls the two hooks below."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import Any

from hisparse_plan.cli.arg_types import non_negative_int, positive_int, positive_size, size_arg
from hisparse_plan.cli.errors import CommandError
from hisparse_plan.cli.input_files import config_label
from hisparse_plan.presets import ConfigError, Settings, Weights, load_preset
from hisparse_plan.presets.config_file import read_config_file
from hisparse_plan.presets.hardware import (
    DEFAULT_ACTIVATION_RESERVE,
    ESTIMATED_UTILIZATION,
    MEASURED_UTILIZATION,
    MemoryBreakdown,
    MemorySizing,
    find_gpu,
    gpu_names,
    memory_breakdown,
    memory_sizing,
)
from hisparse_plan.presets.model_weights import INDEX_FILE, counted_weights, index_weights
from hisparse_plan.presets.settings import DEFAULT_VLLM


def size_list(text: str) -> tuple[int, ...]:
    """Comma-separated sizes, one per pipeline stage: `9GiB,10GiB,10GiB,12GiB`."""
    parts = [part.strip() for part in text.split(",")]
    if not all(parts):
        raise argparse.ArgumentTypeError(f"expected sizes separated by commas, got {text!r}")
    return tuple(size_arg(part) for part in parts)


def add_deployment_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--allow-long-context", action="store_true",
                       help="plan a --max-model-len above the model's max_position_embeddings "
                            "(refused otherwise: the model was not trained for it)")
    group.add_argument("--no-hisparse", action="store_true",
                       help="plan a sparse-MLA preset (deepseek-v3.2, glm-5) without HiSparse: "
                            "every latent and indexer cache a regular layer on the GPU")
    group.add_argument("-pp", "--pipeline-parallel-size", "--pp", dest="pp",
                       type=positive_int, metavar="N",
                       help="pipeline stages (default 1), as vLLM's: decoder layers split as "
                            "vLLM splits them, each stage with --gpu-mem (or its "
                            "--stage-gpu-mem)")
    group.add_argument("-dp", "--data-parallel-size", "--dp", dest="dp", type=positive_int,
                       metavar="N",
                       help="data-parallel ranks (default 1), as vLLM's; with DP attention "
                            "(how DeepSeek is served) each rank holds its own requests in its "
                            "own KV cache (and HiSparse host pool), so the node serves N x one "
                            "rank's concurrency. Weights are replicated per DP rank unless "
                            "--enable-expert-parallel")
    group.add_argument("--enable-expert-parallel", action="store_true",
                       help="as vLLM's: MoE experts sharded over the tp x dp ranks; with --gpu "
                            "the weights are then estimated as split over tp x dp x pp ranks "
                            "(the experts are nearly all of a MoE model's weights)")
    group.add_argument("--stage-gpu-mem", type=size_list, metavar="LIST",
                       help="KV-cache memory of each pipeline stage, e.g. 9GiB,10GiB,10GiB,12GiB")
    group.add_argument("--auto-fit", action="store_true",
                       help="shorten max_model_len to what the GPU memory holds (regular plans)")
    group.add_argument("--gpu", metavar="NAME",
                       help="plan one rank of a real deployment on this GPU "
                            f"({', '.join(gpu_names())}): KV memory = HBM x "
                            "--gpu-memory-utilization - weights (over --tp x --pp ranks: "
                            "--weights-bytes, else a --hf-config's model.safetensors.index.json "
                            "total_size, else --parameters or the preset's count x the bits "
                            "its quantization_config / torch_dtype gives) - --activation-reserve")
    group.add_argument("--weights-bytes", type=positive_size, metavar="SIZE",
                       help="the whole model's weight bytes, all ranks together; with --gpu")
    group.add_argument("--parameters", type=positive_int, metavar="N",
                       help="the model's parameter count, for its weight bytes; with --gpu")
    group.add_argument("--gpu-memory-utilization", metavar="F",
                       help="share of the GPU's memory the engine may use, as vLLM's; default "
                            f"vLLM's own: {MEASURED_UTILIZATION} with 0.34's extensible KV cache "
                            f"(its default on CUDA and ROCm), {ESTIMATED_UTILIZATION} without it "
                            "and on 0.33; needs --gpu (the memory it is a share of)")
    extensible = group.add_mutually_exclusive_group()
    extensible.add_argument("--enable-extensible-kv-cache", dest="extensible_kv_cache",
                            action="store_true", default=None,
                            help="vLLM 0.34's KV cache sized from the memory measured after "
                                 "warm-up (its default on CUDA unless --kv-cache-memory or "
                                 "--num-gpu-blocks-override); with --gpu")
    extensible.add_argument("--no-enable-extensible-kv-cache", dest="extensible_kv_cache",
                            action="store_false",
                            help="the KV cache sized from a profiling estimate, as vLLM 0.33 "
                                 f"always does (gpu_memory_utilization {ESTIMATED_UTILIZATION}); "
                                 "with --gpu")
    group.add_argument("--activation-reserve", type=size_arg, metavar="SIZE",
                       help="HBM kept for activations, CUDA graphs and the CUDA context "
                            f"(default {DEFAULT_ACTIVATION_RESERVE // 2**30}GiB); with --gpu")
    group.add_argument("--kv-cache-memory-bytes", "--kv-cache-memory", dest="kv_cache_memory",
                       type=positive_size, metavar="SIZE",
                       help="KV-cache memory per GPU, as vLLM's --kv-cache-memory-bytes (which "
                            "ignores --gpu-memory-utilization): overrides the --gpu estimate "
                            "(the same as --gpu-mem)")
    group.add_argument("--speculative", choices=["mtp"],
                       help="speculative decoding by MTP: the model's num_nextn_predict_layers "
                            "draft layers join the plan")
    group.add_argument("--num-speculative-tokens", type=non_negative_int, metavar="K",
                       dest="spec_tokens",
                       help="speculative tokens per step (the same as --spec-tokens; with "
                            "--speculative mtp the default is the number of MTP layers)")


def deployment_settings(args: argparse.Namespace, settings: Settings) -> Settings:
    """`settings` with what the deployment flags say."""
    kv_bytes = kv_cache_override(args, settings.gpu_mem_bytes)
    breakdown = given_memory_breakdown(args, kv_bytes)
    if kv_bytes is None and breakdown is not None:
        kv_bytes = breakdown.kv_cache
    return replace(
        settings,
        gpu_mem_bytes=kv_bytes,
        allow_long_context=True if args.allow_long_context else None,
        hisparse=False if args.no_hisparse else None,
        pp=args.pp,
        stage_gpu_mem_bytes=args.stage_gpu_mem,
        auto_fit=True if args.auto_fit else None,
        speculative=args.speculative,
    )


def kv_cache_override(args: argparse.Namespace, gpu_mem: int | None) -> int | None:
    """The KV-cache bytes the user gave (--gpu-mem or --kv-cache-memory), if any."""
    if gpu_mem is not None and args.kv_cache_memory is not None:
        raise CommandError("--gpu-mem and --kv-cache-memory both set the KV-cache memory; "
                           "expected one of them")
    return gpu_mem if gpu_mem is not None else args.kv_cache_memory


def given_memory_breakdown(args: argparse.Namespace, kv_bytes: int | None
                           ) -> MemoryBreakdown | None:
    """`rank_memory`, except that with the KV-cache bytes given (--kv-cache-memory-bytes,
    --gpu-mem) weights that do not fit the GPU are no refusal: --gpu then names only the GPU
    (its compute capability, hence vLLM's backends and layout), and no breakdown is shown."""
    if kv_bytes is None:
        return rank_memory(args)
    if args.gpu is not None:
        find_gpu(args.gpu)  # an unknown name stays a refusal
    try:
        return rank_memory(args)
    except ConfigError as error:
        if error.field != "gpu" or "leaves no KV cache" not in str(error):
            raise
        return None


def rank_memory(args: argparse.Namespace) -> MemoryBreakdown | None:
    """Where one rank's HBM goes, with --gpu; None without it."""
    if args.gpu is None:
        for flag, value in (("--gpu-memory-utilization", args.gpu_memory_utilization),
                            ("--activation-reserve", args.activation_reserve),
                            ("--weights-bytes", args.weights_bytes),
                            ("--parameters", args.parameters),
                            ("--[no-]enable-extensible-kv-cache", _extensible(args))):
            if value is not None:
                raise CommandError(f"{flag} needs --gpu NAME (the HBM it is a share of)")
        return None
    reserve = args.activation_reserve
    return memory_breakdown(
        find_gpu(args.gpu),
        deployment_weights(args),
        tp=weight_shards(args),
        pp=args.pp or 1,
        activation_reserve=DEFAULT_ACTIVATION_RESERVE if reserve is None else reserve,
        sizing=sizing_from(args),
    )


def _extensible(args: argparse.Namespace) -> bool | None:
    value: bool | None = getattr(args, "extensible_kv_cache", None)
    return value


def sizing_from(args: argparse.Namespace) -> MemorySizing:
    """How the chosen vLLM sizes the cache on a GPU, and the share it takes, from the flags."""
    return memory_sizing(
        getattr(args, "vllm_version", None) or DEFAULT_VLLM,
        gpu_memory_utilization=args.gpu_memory_utilization,
        extensible=_extensible(args),
        kv_cache_memory_given=args.kv_cache_memory is not None or args.gpu_mem is not None,
        num_blocks_override_given=getattr(args, "num_gpu_blocks_override", None) is not None,
    )


def weight_shards(args: argparse.Namespace) -> int:
    """The ranks of one pipeline stage that split the weights: tp, or tp x dp when experts are
    sharded over the data-parallel ranks too (--enable-expert-parallel)."""
    tp: int = args.tp or 1
    return tp * (args.dp or 1) if args.enable_expert_parallel else tp


def deployment_weights(args: argparse.Namespace) -> Weights | int:
    """The whole model's weights, from the best source the arguments give (`model_weights`)."""
    if args.weights_bytes is not None:
        return int(args.weights_bytes)
    hf_config = getattr(args, "hf_config", None)
    if hf_config is not None:
        path = Path(hf_config)
        from_index = index_weights(path)
        if from_index is not None:
            return from_index.total_bytes
        if args.parameters is not None:
            return counted_weights(args.parameters, _config_fields(path))
        raise CommandError(
            f"--gpu: no {INDEX_FILE} beside {path} to read the weight bytes from; give "
            "--weights-bytes SIZE or --parameters N"
        )
    if getattr(args, "model", None) is None:
        raise CommandError("--gpu needs the model's weights: a preset, a --hf-config with its "
                           f"{INDEX_FILE}, or --weights-bytes")
    preset = load_preset(args.model)
    if args.parameters is not None:
        bits = preset.weights.bits_per_parameter if preset.weights is not None else "16"
        return Weights(args.parameters, bits, "--parameters")
    if preset.weights is None:
        raise CommandError(f"--gpu: preset {preset.name} has no parameter count to estimate "
                           "its weights from; give --weights-bytes, --parameters or --gpu-mem")
    return preset.weights


def _config_fields(path: Path) -> dict[str, Any]:
    """The config's top-level fields (where `quantization_config` and `torch_dtype` live, a
    multimodal wrapper's included)."""
    return read_config_file(path, label=config_label(str(path)))
