"""Random SGLang cases: SGLang 0.5.23's own report against our planner's, field by field.

    python references/sglang_diff.py --seed 0 --count 20 [--kinds mha,swa,...] [--dump]
        [--server-args-fields]

Each case (a config built from a fixture in tests/hf_configs or from DeepSeek-V4-Flash's
config in references/sglang_cases, with random layers, heads, dims, dtypes, tp, page size,
context length, memory) is run twice:

* the reference, ``sglang_reference.run_case_safely``: in this process when SGLang imports
  here, else in one subprocess of the SGLang interpreter (``--sglang-python``, default
  ``$SGLANG_PYTHON`` or /work/sglang/bin/python, with the import stubs on PYTHONPATH);
* our side, ``hisparse_plan.adapters.sglang.report_for_case(case)``.

With ``--server-args-fields`` each case also carries one to three ServerArgs fields the
planner accepts and ignores, with values drawn from SGLang's own command line
(sglang_server_args_draw.py; needs SGLang in this interpreter): SGLang's report must not move.

It prints one line per case (agree / both refuse / mismatch with the first differing
field and both values) and the totals.  Without SGLang it says so and exits 2; without
our side it says so and dumps the reference reports.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import random
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
    from hisparse_plan.models.request import PlanRequest

JSONValue: TypeAlias = Any
"""A decoded JSON value."""

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
FIXTURES = REPO / "tests" / "hf_configs"
V4_CONFIG = HERE / "sglang_cases" / "deepseek_v4_flash_config.json"
STUBS = os.environ.get("SGLANG_STUBS", str(HERE / "sglang_stubs"))
DEFAULT_SGLANG_PYTHON = os.environ.get("SGLANG_PYTHON", "/work/sglang/bin/python")

COMPARED = (
    "page_size",
    "max_total_num_tokens",
    "max_running_requests",
    "cell_size_bytes",
    "available_bytes",
    "req_to_token",
    "pools",
    "draft_pools",
    "hisparse_metadata",
    "stages",
)
GIB = 1 << 30
H200_FREE = 139 * GIB

Case = dict[str, Any]


def _fixture(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((FIXTURES / name / "config.json").read_text())
    return loaded


def _memory(rng: random.Random, weights_gib: float) -> dict[str, int]:
    if rng.random() < 0.5:
        return {"available_bytes": rng.randrange(256 << 20, 16 * GIB)}
    return {
        "pre_model_load_free_bytes": H200_FREE,
        "post_weights_free_bytes": H200_FREE - int(weights_gib * GIB),
    }


H200_TOTAL = 143771 << 20
B200_TOTAL = 183359 << 20


def _common_args(rng: random.Random, tp_choices: list[int]) -> dict[str, Any]:
    args: dict[str, Any] = {
        "tp_size": rng.choice(tp_choices),
        "context_length": rng.choice([2048, 4096, 8192, 32768]),
        "mem_fraction_static": rng.choice([0.8, 0.85, 0.88, 0.9]),
    }
    if rng.random() < 0.3:
        args["max_running_requests"] = rng.choice([1, 8, 64, 256, 1024])
    if rng.random() < 0.2:
        args["max_total_tokens"] = rng.randrange(4096, 200_000)
    _draw_modes(rng, args)
    return args


def _draw_modes(rng: random.Random, args: dict[str, Any]) -> None:
    """SGLang's server modes, each drawn on its own: DP attention (dp_size a divisor of
    tp_size, or plain dp replicas), DeepEP's all-to-all (with a deepep_mode now and then),
    the radix cache off (mostly with the running requests given, which its window and Mamba
    rules read), the overlap scheduler off (SGLang's Mamba strategy and window chunks read
    it)."""
    tp = args["tp_size"]
    if tp > 1 and rng.random() < 0.5:
        args["dp_size"] = rng.choice([d for d in (2, 4, 8) if tp % d == 0])
        args["enable_dp_attention"] = rng.random() < 0.8
    if rng.random() < 0.15:
        args["moe_a2a_backend"] = "deepep"
        if rng.random() < 0.5:
            args["deepep_mode"] = rng.choice(["auto", "normal", "low_latency"])
    if rng.random() < 0.3:
        args["disable_radix_cache"] = True
        if "max_running_requests" not in args and rng.random() < 0.7:
            args["max_running_requests"] = rng.choice([1, 8, 64, 256])
    if rng.random() < 0.12:
        args["disable_overlap_schedule"] = True


def _on_default_fraction(rng: random.Random, case: Case) -> Case:
    """The case on an H200 or B200 with SGLang's default mem_fraction_static."""
    args = case["server_args"]
    args.pop("mem_fraction_static", None)
    total = rng.choice([H200_TOTAL, B200_TOTAL])
    case["gpu"] = {"total_memory_bytes": total,
                   "name": "NVIDIA H200" if total == H200_TOTAL else "NVIDIA B200"}
    weights = rng.randrange(2, 60) * GIB
    case["memory"] = {"pre_model_load_free_bytes": total - 2 * GIB,
                      "post_weights_free_bytes": total - 2 * GIB - weights}
    return case


def _eagle_draft(rng: random.Random, target: dict[str, Any]) -> dict[str, Any]:
    """An EAGLE3 draft for a target: a Llama-architecture draft of one or two layers with the
    target's dtype and KV heads, sometimes another head count (its own pool's shape), and now
    and then a context of its own shorter than the server's (published EAGLE-3 drafts train
    on 2K to 8K; SGLang refuses them unless allowed)."""
    draft = _fixture("llama-3.1-8b-instruct")
    heads = target.get("num_key_value_heads", 8)
    draft.update(
        architectures=["LlamaForCausalLMEagle3"], num_hidden_layers=rng.choice([1, 1, 2]),
        num_key_value_heads=rng.choice([heads, heads, 8]),
        num_attention_heads=target.get("num_attention_heads", 32),
        head_dim=target.get("head_dim", 128), torch_dtype=target.get("torch_dtype", "bfloat16"),
    )
    if rng.random() < 0.3:
        draft.pop("rope_scaling", None)
        draft["max_position_embeddings"] = rng.choice([2048, 4096, 8192])
    return draft


def _window_draft(rng: random.Random, case: Case) -> None:
    """A window model drafting with window layers: its own checkpoint as an EAGLE or EAGLE3
    draft, or a drafted gpt-oss config of two to four alternating layers (sometimes other KV
    heads or another window), as EAGLE3; the radix cache off more often than elsewhere."""
    args, cfg = case["server_args"], case["config"]
    if "disable_radix_cache" not in args and rng.random() < 0.3:
        # The radix cache off more often here: the window pool's request cap prices the
        # draft's window layers too.
        args["disable_radix_cache"] = True
    if rng.random() < 0.6:
        args["speculative_algorithm"] = rng.choice(["EAGLE", "EAGLE", "EAGLE3"])
        args["speculative_draft_model_path"] = "@model"
        return
    args["speculative_algorithm"] = "EAGLE3"
    layers = rng.choice([2, 3, 4])
    draft = dict(cfg)
    draft.update(
        num_hidden_layers=layers,
        layer_types=[("sliding_attention", "full_attention")[i % 2] for i in range(layers)],
        num_key_value_heads=rng.choice([cfg["num_key_value_heads"], 4]),
        sliding_window=rng.choice([cfg["sliding_window"], 128]),
    )
    case["draft_config"] = draft


def _speculative(rng: random.Random, case: Case, kind: str) -> Case:
    """Sometimes speculative decoding: NEXTN for the MLA/DSA kinds and DeepSeek-V4 (their
    configs' num_nextn_predict_layers, the model's own MTP layers), EAGLE3 with a drafted
    config for MHA and window models (for a window model mostly a draft with window layers:
    its own checkpoint, or a drafted window config, `_window_draft`; Llama-4 its own
    checkpoint), EAGLE on a Mamba hybrid's own MTP head; steps / top-k / draft tokens
    SGLang's choice or given. HiSparse's kind draws it more often, with draft tokens on both
    sides of its speculative swap's 2..4."""
    rate = 0.6 if kind == "hisparse" else 0.5 if kind in ("swa", "llama4") else 0.3
    if rng.random() >= rate or kind not in (
            "mha", "swa", "mla", "dsa", "mamba", "hisparse", "v4", "shared_index", "llama4"):
        return case
    args, cfg = case["server_args"], case["config"]
    if kind == "swa" and rng.random() < 0.7:
        _window_draft(rng, case)
    elif kind == "llama4":
        # Llama-4 drafting with its own checkpoint: SGLang's draft keeps its window layers
        # (every layer but each fourth) in a window pool of its own.
        args["speculative_algorithm"] = rng.choice(["EAGLE", "EAGLE3"])
        args["speculative_draft_model_path"] = "@model"
    elif kind in ("mla", "dsa", "hisparse", "v4", "shared_index"):
        args["speculative_algorithm"] = "NEXTN"
        cfg["num_nextn_predict_layers"] = rng.choice([1, 1, 2])
    elif kind == "mamba":
        args["speculative_algorithm"] = "EAGLE"
        args["speculative_draft_model_path"] = "@model"
    else:
        args["speculative_algorithm"] = "EAGLE3"
        case["draft_config"] = _eagle_draft(rng, cfg)
        if rng.random() < 0.3:
            args["allow_overwrite_longer_context_len"] = True
    if rng.random() < 0.4:
        steps = rng.choice([1, 2, 3, 4, 5] if kind == "hisparse" else [1, 2, 3, 5])
        topk = 1 if args.get("page_size", 64 if kind != "mha" else 1) > 1 else rng.choice([1, 2])
        args.update(speculative_num_steps=steps, speculative_eagle_topk=topk,
                    speculative_num_draft_tokens=rng.choice([steps + 1, 2 * steps + 2]))
    return case


PIPELINE_KINDS = frozenset({"mha", "swa", "mla", "dsa", "hisparse", "minimax", "hybrid",
                            "llama4", "v4"})
"""Kinds whose SGLang model classes split their layers over pipeline ranks (make_pp_layers or
get_pp_indices): Llama, gpt-oss, DeepSeek-V3/V3.2, GLM-5, MiniMax-M2, Qwen3.5, Llama-4,
DeepSeek-V4."""


def _draw_pipeline(rng: random.Random, kind: str, case: Case) -> None:
    """Pipeline stages (pp_size 2 to 4, at most the model's layers), drawn on their own for
    the kinds whose model classes split their layers; most often for the hybrid kind."""
    if kind not in PIPELINE_KINDS or rng.random() >= (0.7 if kind == "hybrid" else 0.3):
        return
    cfg = case["config"]
    layers = cfg.get("text_config", cfg)["num_hidden_layers"]
    choices = [pp for pp in (2, 3, 4) if pp <= layers]
    if choices:
        case["server_args"]["pp_size"] = rng.choice(choices)


def _default_fraction(rng: random.Random, case: Case) -> Case:
    """Sometimes SGLang's default mem_fraction_static on an H200 or B200 (the rule DP
    attention and DeepEP move), with pre/post-weights figures of that GPU."""
    args = case["server_args"]
    if rng.random() < (0.6 if "moe_a2a_backend" in args or "dp_size" in args else 0.25):
        return _on_default_fraction(rng, case)
    return case


def modes_of(case: Case) -> list[str]:
    """The server modes a case runs (for the per-mode totals)."""
    args = case.get("server_args", {})
    modes = []
    if args.get("enable_dp_attention") and args.get("dp_size", 1) > 1:
        modes.append("dp_attention")
    elif args.get("dp_size", 1) > 1:
        modes.append("dp_replicas")
    if args.get("moe_a2a_backend") == "deepep":
        modes.append("deepep")
    if args.get("disable_radix_cache"):
        modes.append("radix_off")
    if args.get("disable_overlap_schedule"):
        modes.append("overlap_off")
    if args.get("dcp_size", 1) > 1:
        modes.append("dcp")
    if args.get("speculative_algorithm"):
        modes.append("speculative")
        draft = case.get("draft_config") or (
            case.get("config") if args.get("speculative_draft_model_path") == "@model" else None)
        if isinstance(draft, str) and (REPO / draft).is_file():  # a case file's config path
            draft = json.loads((REPO / draft).read_text())
        if isinstance(draft, dict) and ("sliding_attention" in draft.get("layer_types", ())
                                        or draft.get("architectures") == [
                                            "Llama4ForConditionalGeneration"]):
            modes.append("window_draft")
    if args.get("pp_size", 1) > 1:
        modes.append("pipeline")
    if args.get("enable_hisparse"):
        modes.append("hisparse")
    if "total_memory_bytes" in case.get("gpu", {}):
        modes.append("default_fraction")
    if str(case.get("name", "")).startswith("preset:"):
        modes.append("preset")
    capability = case.get("gpu", {}).get("capability")
    return (modes or ["plain"]) + ([] if capability is None else [f"sm{capability[0]}0"])


def case_mha(rng: random.Random) -> Case:
    cfg = _fixture("llama-3.1-8b-instruct")
    kv_heads = rng.choice([1, 2, 4, 8, 16])
    cfg.update(
        num_hidden_layers=rng.randrange(1, 49),
        num_key_value_heads=kv_heads,
        num_attention_heads=kv_heads * rng.choice([1, 2, 4, 8]),
        head_dim=rng.choice([64, 128, 256]),
        torch_dtype=rng.choice(["bfloat16", "float16"]),
    )
    args = _common_args(rng, [1, 2, 4, 8])
    args["kv_cache_dtype"] = rng.choice(["auto", "auto", "fp8_e4m3", "bfloat16"])
    if rng.random() < 0.5:
        args["page_size"] = rng.choice([1, 16, 32, 64])
    return {"config": cfg, "server_args": args, "memory": _memory(rng, 2)}


def case_swa(rng: random.Random) -> Case:
    cfg = _fixture("gpt-oss-120b")
    layers = rng.randrange(2, 37)
    cfg.update(
        num_hidden_layers=layers,
        layer_types=[("sliding_attention", "full_attention")[i % 2] for i in range(layers)],
        sliding_window=rng.choice([128, 256, 512]),
    )
    args = _common_args(rng, [1, 2, 4, 8])
    if rng.random() < 0.5:
        args["swa_full_tokens_ratio"] = rng.choice([0.1, 0.25, 0.5, 0.8, 1.0])
    return {"config": cfg, "server_args": args, "memory": _memory(rng, 8)}


def case_mamba(rng: random.Random) -> Case:
    """Qwen3-Next: sometimes with an explicit layer_types (SGLang's own interval layers, or
    another pattern, which SGLang does not build), sometimes a page given."""
    cfg = _fixture("qwen3-next-80b-a3b-instruct")
    cfg.update(num_hidden_layers=4 * rng.randrange(1, 13))
    if rng.random() < 0.2:
        every = cfg["full_attention_interval"]
        offset = rng.choice([0, 0, 1])
        cfg["layer_types"] = ["full_attention" if (i + 1 + offset) % every == 0
                              else "linear_attention" for i in range(cfg["num_hidden_layers"])]
    args = _common_args(rng, [1, 2, 4, 8])
    if rng.random() < 0.2:
        args["page_size"] = rng.choice([16, 64])
    if rng.random() < 0.4:
        args["max_mamba_cache_size"] = rng.randrange(8, 400)
    if rng.random() < 0.4:
        args["mamba_full_memory_ratio"] = rng.choice([0.5, 0.9, 2.0])
    return {"config": cfg, "server_args": args, "memory": _memory(rng, 20)}


def case_hybrid(rng: random.Random) -> Case:
    """Qwen3.5 (linear attention, one full-attention layer in four): a Mamba hybrid whose
    SGLang class takes pipeline stages."""
    cfg = _fixture("qwen3.5-35b-a3b")
    text = cfg["text_config"]
    layers = 4 * rng.randrange(1, 11)
    text.update(num_hidden_layers=layers,
                layer_types=[("linear_attention", "full_attention")[i % 4 == 3]
                             for i in range(layers)])
    args = _common_args(rng, [1, 2, 4])
    if rng.random() < 0.3:
        args["max_mamba_cache_size"] = rng.randrange(8, 400)
    return {"config": cfg, "server_args": args, "memory": _memory(rng, 20)}


def case_mla(rng: random.Random) -> Case:
    cfg = _fixture("deepseek-v3")
    cfg.update(num_hidden_layers=rng.randrange(4, 62))
    args = _common_args(rng, [1, 8])
    args["kv_cache_dtype"] = rng.choice(["auto", "fp8_e4m3"])
    return {"config": cfg, "server_args": args, "memory": _memory(rng, 80)}


def _dsa(rng: random.Random, hisparse: bool) -> Case:
    cfg = _fixture(rng.choice(["deepseek-v3.2-exp", "glm-5"]))
    cfg.update(num_hidden_layers=rng.randrange(4, 62))
    args = _common_args(rng, [1, 8])
    args["kv_cache_dtype"] = "fp8_e4m3" if hisparse else rng.choice(["fp8_e4m3", "bfloat16"])
    fp8 = args["kv_cache_dtype"] == "fp8_e4m3"
    args["dsa_backend"] = rng.choice(["flashmla_kv", "trtllm"] if fp8 else ["flashmla_sparse"])
    attn_tp = args["tp_size"] // (args.get("dp_size", 1) if args.get("enable_dp_attention")
                                   else 1)
    if attn_tp > 1 and rng.random() < (0.1 if hisparse else 0.35):  # both refuse HiSparse's
        args["dcp_size"] = rng.choice([d for d in (2, 4, 8) if attn_tp % d == 0])
        if fp8 and rng.random() < 0.5:  # DCP's own backends (trtllm) where none is given
            args.pop("dsa_backend")
    if rng.random() < 0.15:  # a page SGLang rewrites to the DSA page (64)
        args["page_size"] = rng.choice([1, 16, 32, 128])
    if hisparse:
        args["dsa_backend"] = "flashmla_kv"
        args["enable_hisparse"] = True
        if rng.random() < 0.5:  # the top-k HiSparse's coordinator runs, around its 1024 floor
            cfg["index_topk"] = rng.choice([512, 1000, 1024, 1536, 2048, 2560, 4096])
        top_k = rng.choice([512, 1024, 2048, cfg["index_topk"], cfg["index_topk"]])
        args["hisparse_config"] = {
            "top_k": top_k,
            "device_buffer_size": top_k * rng.choice([1, 2]),
            "host_to_device_ratio": rng.choice([1, 2, 4, 8]),
        }
    return {"config": cfg, "server_args": args, "memory": _memory(rng, 80)}


def case_dsa(rng: random.Random) -> Case:
    return _dsa(rng, hisparse=False)


def case_hisparse(rng: random.Random) -> Case:
    return _dsa(rng, hisparse=True)


def case_v4(rng: random.Random) -> Case:
    cfg: dict[str, Any] = json.loads(V4_CONFIG.read_text())
    layers = rng.randrange(4, 44)
    ratios = [0, 0] + [(4, 128)[i % 2] for i in range(layers - 2)]
    cfg.update(num_hidden_layers=layers, compress_ratios=[*ratios, 0])
    args = _common_args(rng, [1, 8])
    if rng.random() < 0.4:
        args["swa_full_tokens_ratio"] = rng.choice([0.05, 0.1, 0.2])
    if rng.random() < 0.4:
        _draw_v4_hisparse(rng, args)
    return {"config": cfg, "server_args": args, "memory": _memory(rng, 20)}


def _draw_v4_hisparse(rng: random.Random, args: dict[str, Any]) -> None:
    """HiSparse on DeepSeek-V4: its c4 pool shrunk by host_to_device_ratio, a paged host pool
    (the device buffer at least the model's index_topk, 512, which the coordinator runs)."""
    top_k = rng.choice([512, 1024, 2048])
    args["enable_hisparse"] = True
    args["hisparse_config"] = {
        "top_k": top_k,
        "device_buffer_size": top_k * rng.choice([1, 2]),
        "host_to_device_ratio": rng.choice([1, 2, 4, 8]),
    }


def case_gemma(rng: random.Random) -> Case:
    """Gemma-2 / Gemma-3 (SGLang serves their window layers in the full pool)."""
    name = rng.choice(["gemma-2-9b-it", "gemma-2-27b-it", "gemma-3-1b-it", "gemma-3-4b-it",
                       "gemma-3-27b-it"])
    cfg = _fixture(name)
    text = cfg.get("text_config", cfg)
    text.update(num_hidden_layers=rng.randrange(2, 48))
    if "layer_types" in text:
        text.pop("layer_types")
    args = _common_args(rng, [1, 2, 4])
    args["kv_cache_dtype"] = rng.choice(["auto", "auto", "fp8_e4m3"])
    if rng.random() < 0.4:
        args["page_size"] = rng.choice([1, 16, 64])
    if rng.random() < 0.2:  # the context SGLang derives (Gemma-3: its layer-typed rope)
        args.pop("context_length")
        args["max_running_requests"] = rng.choice([1, 4])
    return {"config": cfg, "server_args": args, "memory": _memory(rng, 10)}


def case_vlm(rng: random.Random) -> Case:
    """A multimodal checkpoint served multimodal or not, on SGLang's default fraction (which
    drops prefill graphs and scales by the vision encoder), the encoder drawn at random."""
    cfg = _fixture(rng.choice(["qwen2.5-vl-7b-instruct", "gemma-3-4b-it", "gemma-3-27b-it"]))
    vision = cfg.setdefault("vision_config", {})
    if rng.random() < 0.5:
        vision["hidden_size"] = rng.choice([768, 1024, 1152, 1280, 1664])
    if rng.random() < 0.5:
        vision["num_hidden_layers"] = rng.randrange(8, 48)
    text = cfg.get("text_config", cfg)
    text.update(num_hidden_layers=rng.randrange(2, 32))
    text.pop("layer_types", None)
    args = _common_args(rng, [1, 2, 4])
    if rng.random() < 0.7:
        args["enable_multimodal"] = rng.random() < 0.8
    case = {"config": cfg, "server_args": args, "memory": _memory(rng, 10)}
    return _on_default_fraction(rng, case)


def case_minimax(rng: random.Random) -> Case:
    """MiniMax-M2-like: attn_type_list all 1 (every layer full attention)."""
    layers = rng.randrange(2, 63)
    cfg = {
        "architectures": ["MiniMaxM2ForCausalLM"], "model_type": "minimax_m2",
        "hidden_size": 3072, "num_hidden_layers": layers, "num_attention_heads": 48,
        "num_key_value_heads": rng.choice([4, 8]), "head_dim": 128,
        "attn_type_list": [1] * layers, "max_position_embeddings": 196608,
        "intermediate_size": 1536, "num_local_experts": 256, "num_experts_per_tok": 8,
        "vocab_size": 200064, "rotary_dim": 64, "rope_theta": 5000000,
        "torch_dtype": "bfloat16",
    }
    args = _common_args(rng, [1, 2, 4, 8])
    return {"config": cfg, "server_args": args, "memory": _memory(rng, 30)}


def case_llama4(rng: random.Random) -> Case:
    """Llama-4-like: SGLang's window hybrid (Llama4ForConditionalGeneration: every 4th layer
    full, the rest in the window pool over attention_chunk_size or a sliding_window key), now
    and then the text-only Llama4ForCausalLM (one full pool) or a no_rope_layers list SGLang
    does not read. At least 4 layers: SGLang's all-window layout (1-3 layers) is refused.
    (A Llama4ForCausalLM config with a vision_config would be multimodal to SGLang, whose
    default fraction then shrinks for the vision tower: adjust_mem_fraction_for_vlm, a
    multimodal rule the planner does not apply.)"""
    cfg = _fixture(rng.choice(["llama-4-scout-17b-16e-instruct",
                               "llama-4-maverick-17b-128e-instruct"]))
    text = cfg["text_config"]
    layers = rng.randrange(4, 49)
    kv_heads = rng.choice([1, 2, 4, 8])
    text.update(
        num_hidden_layers=layers, num_key_value_heads=kv_heads,
        num_attention_heads=kv_heads * rng.choice([1, 5]), head_dim=rng.choice([64, 128]),
        attention_chunk_size=rng.choice([128, 1024, 8192]),
    )
    draw = rng.random()
    if draw < 0.15:
        text["no_rope_layers"] = [rng.choice([0, 1]) for _ in range(layers)]
    elif draw < 0.25:
        text["sliding_window"] = rng.choice([256, 512])
    elif draw < 0.35:  # the text-only checkpoint: its text_config, as its own config.json
        cfg = {**text, "architectures": ["Llama4ForCausalLM"]}
    args = _common_args(rng, [1, 2, 4, 8])
    args["kv_cache_dtype"] = rng.choice(["auto", "auto", "fp8_e4m3"])
    if rng.random() < 0.5:
        args["swa_full_tokens_ratio"] = rng.choice([0.1, 0.25, 0.5, 0.8, 1.0])
    if rng.random() < 0.4:
        args["page_size"] = rng.choice([1, 16, 64])
    return {"config": cfg, "server_args": args, "memory": _memory(rng, 30)}


def case_blackwell(rng: random.Random) -> Case:
    """Another kind's case on a GPU of compute capability 10.0 (B200) or 9.0 (H200)."""
    kind = rng.choice(["mha", "swa", "mla", "dsa", "hisparse", "gemma", "mamba", "llama4",
                       "hybrid"])
    case = KINDS[kind](rng)
    if kind in ("dsa", "hisparse") and rng.random() < 0.6:
        case["server_args"].pop("dsa_backend", None)
        if rng.random() < 0.7:
            case["server_args"]["kv_cache_dtype"] = "auto"
    case["gpu"] = {"capability": rng.choice([[10, 0], [10, 0], [9, 0]])}
    return case


def case_shared_index(rng: random.Random) -> Case:
    """GLM-5-style DSA whose layers share one index (index_topk_freq, index_skip_topk_offset)."""
    case = _dsa(rng, hisparse=rng.random() < 0.3)
    case["config"]["index_topk_freq"] = rng.choice([2, 3, 4])
    if rng.random() < 0.6:
        case["config"]["index_skip_topk_offset"] = rng.choice([0, 1, 2])
    return case


def case_long_context(rng: random.Random) -> Case:
    """A context_length above the model's own, allowed or not, or none (the derived one)."""
    case = KINDS[rng.choice(["mha", "gemma", "mla"])](rng)
    args = case["server_args"]
    if rng.random() < 0.25:
        args.pop("context_length", None)
        args.pop("max_running_requests", None)
        args["max_running_requests"] = rng.choice([1, 8])
        return case
    cfg = case["config"]
    limit = cfg.get("text_config", cfg).get("max_position_embeddings", 8192)
    args["context_length"] = limit + rng.choice([1, 4096, limit])
    if rng.random() < 0.5:
        args["allow_overwrite_longer_context_len"] = True
        args["max_running_requests"] = rng.choice([1, 4])
    return case


def case_unloadable(rng: random.Random) -> Case:
    """A config SGLang cannot load: no model_type, or an architecture it does not serve."""
    if rng.random() < 0.5:
        case = case_mha(rng)
        case["config"].pop("model_type")
        return case
    cfg = _fixture(rng.choice(["ai21-jamba-mini-1.6", "minimax-m1-40k"]))
    return {"config": cfg, "server_args": _common_args(rng, [1, 2]), "memory": _memory(rng, 10)}


KINDS: dict[str, Callable[[random.Random], Case]] = {
    "mha": case_mha,
    "swa": case_swa,
    "mamba": case_mamba,
    "hybrid": case_hybrid,
    "mla": case_mla,
    "dsa": case_dsa,
    "hisparse": case_hisparse,
    "v4": case_v4,
    "gemma": case_gemma,
    "minimax": case_minimax,
    "vlm": case_vlm,
    "blackwell": case_blackwell,
    "shared_index": case_shared_index,
    "long_context": case_long_context,
    "unloadable": case_unloadable,
    "llama4": case_llama4,
}


def make_cases(seed: int, count: int, kinds: list[str]) -> list[Case]:
    rng = random.Random(seed)
    cases = []
    for i in range(count):
        kind = kinds[i % len(kinds)]
        case = KINDS[kind](rng)
        _draw_pipeline(rng, kind, case)
        case = _default_fraction(rng, case)
        case = _speculative(rng, case, kind)
        case["name"] = f"{kind}-{seed}-{i}"
        cases.append(case)
    return cases


def _sglang_in_process() -> bool:
    return importlib.util.find_spec("sglang") is not None


def reference_reports(cases: list[Case], sglang_python: str) -> list[dict[str, Any]] | None:
    """SGLang's reports, or None when SGLang is nowhere to be found."""
    if _sglang_in_process():
        sys.path.insert(0, str(HERE))
        ref = importlib.import_module("sglang_reference")
        return [ref.run_case_safely(case) for case in cases]
    if not Path(sglang_python).exists():
        return None
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (STUBS, str(HERE), env.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sglang_python, str(HERE / "sglang_reference.py"), "-"],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        return None
    loaded, _ = json.JSONDecoder().raw_decode(proc.stdout)
    return loaded if isinstance(loaded, list) else [loaded]


def our_side() -> Callable[[Case], dict[str, Any]] | None:
    try:
        module = importlib.import_module("hisparse_plan.adapters.sglang")
    except ImportError:
        return None
    func = getattr(module, "report_for_case", None)
    return func if callable(func) else None


def first_difference(
    ours: JSONValue, ref: JSONValue, path: str = ""
) -> tuple[str, JSONValue, JSONValue] | None:
    """The first field (a dotted path) where the two reports differ."""
    if isinstance(ref, dict) and isinstance(ours, dict):
        keys = list(ref) if path else [k for k in COMPARED if k in ref]
        for key in keys:
            found = first_difference(ours.get(key), ref.get(key), f"{path}.{key}" if path else key)
            if found:
                return found
        if path:
            extra = sorted(set(ours) - set(ref))
            if extra:
                return f"{path}.{extra[0]}", ours[extra[0]], None
        return None
    if isinstance(ref, list) and isinstance(ours, list):
        for i, (a, b) in enumerate(zip(ours, ref, strict=False)):
            found = first_difference(a, b, f"{path}[{i}]")
            if found:
                return found
        if len(ours) != len(ref):
            return f"{path}.length", len(ours), len(ref)
        return None
    if isinstance(ref, float) or isinstance(ours, float):
        if ours is None or ref is None or float(ours) != float(ref):
            return path, ours, ref
        return None
    if ours != ref:
        return path, ours, ref
    return None


UNUSABLE = "refused, unusable in SGLang"
"""Our refusal of a plan SGLang builds but its own code cannot run (the reference's
`unusable`: its decode swap-in asserts, its HiSparse coordinator refuses to start), naming
the same setting."""


UNUSABLE_NAMES = {"decode swap-in": "hisparse_device_buffer_size", "model build": "layer 0",
                  "model decode": "layer 0",
                  "coordinator startup: HiSparse spec swap requires 2-4": (
                      "2..4 draft tokens and top_k >= 1024"),
                  "coordinator startup: HiSparse spec swap supports at most 8192": "at most 8192",
                  "coordinator startup: HiSparse spec request capacity": "request slots",
                  "coordinator startup: HiSparse spec scratch and device buffer sizes": (
                      "multiples of page_size"),
                  "draft full-layer write": "full part then holds no token",
                  "model layers: Qwen3-Next": "full_attention_interval"}
"""The reference's probe (the start of its `unusable`) and what our refusal names for it."""


UNUSABLE_HERE = "SGLang unusable here"
"""SGLang refusing for a package this CPU host lacks (a flag's plugin or library): no
comparison is possible here, and the case is counted apart, never as agreeing. Our side is
then only asked not to crash."""
HOST_ABSENT = (
    re.compile(r"^ModuleNotFoundError: No module named '(torch_memory_saver|flashinfer|granian)"),
    re.compile(r"requires the '\w+' package"),
    re.compile(r"plugin is not installed"),
    re.compile(r"FlashInfer mamba module not available"),
    re.compile(r"on SM100\+ requires CUDA 13\+, got CUDA 12\.8"),
)
"""SGLang's messages for a package absent on this host (torch_memory_saver for
--enable-memory-saver, granian for --enable-http2, the sgl-nvidia-mega plugin for
--enable-nvidia-megakernel, FlashInfer's modules such as --mamba-backend flashinfer's), and
SGLang's CUDA version check where the CUDA-host stand-in answers 12.8 (sglang_cuda_host.py)."""


def _unusable_here(ref: dict[str, Any]) -> bool:
    return "refused" in ref and any(p.search(ref["refused"]) for p in HOST_ABSENT)


def _refused_as_unusable(ours: dict[str, Any], ref: dict[str, Any]) -> bool:
    if "refused" not in ours or "refused" in ref or "unusable" not in ref:
        return False
    named = [name for probe, name in UNUSABLE_NAMES.items() if ref["unusable"].startswith(probe)]
    return bool(named) and named[0] in str(ours["refused"])


def compare(ours: dict[str, Any], ref: dict[str, Any]) -> str:
    if _unusable_here(ref):
        return UNUSABLE_HERE
    if "refused" in ref and "refused" in ours:
        return "both refuse"
    if _refused_as_unusable(ours, ref):
        return UNUSABLE
    if "unusable" in ref and "refused" not in ours:
        return f"mismatch: ours plans what SGLang cannot run ({ref['unusable'][:200]})"
    if "refused" in ref:
        return f"mismatch: SGLang refuses ({ref['refused'][:200]}), ours does not"
    if "refused" in ours:
        return f"mismatch: ours refuses ({str(ours['refused'])[:200]}), SGLang does not"
    found = first_difference(ours, ref)
    if found is None:
        return "agree"
    field, a, b = found
    return f"mismatch at {field}: ours {json.dumps(a)[:200]} vs SGLang {json.dumps(b)[:200]}"


def _ours_safely(func: Callable[[Case], dict[str, Any]], case: Case) -> dict[str, Any]:
    try:
        report = func(case)
    except Exception as exc:  # a refusal of our planner is a PlanError; report any
        return {"refused": f"{type(exc).__name__}: {exc}"}
    # report_for_case gives a refusal as {"error": message}.
    return {"refused": report["error"]} if "error" in report else report


def _preset_side(request: PlanRequest) -> Callable[[Case], dict[str, Any]]:
    """Our report of a preset's case: the plan of the CLI's own request."""

    def report(case: Case) -> dict[str, Any]:
        from hisparse_plan.adapters.sglang import report as sglang_report
        from hisparse_plan.targets.sglang import plan_sglang

        return sglang_report(plan_sglang(request))

    return report


GPUS: dict[str, tuple[int, int]] = {"sm90": (9, 0), "sm100": (10, 0)}
"""`--gpu`: the compute capability SGLang resolves its server arguments for."""


def on_gpu(case: Case, capability: tuple[int, int]) -> None:
    """The case on a GPU of `capability`, unless it names its own."""
    gpu = case.setdefault("gpu", {})
    gpu.setdefault("capability", list(capability))


def fixed_case(path: Path) -> Case:
    """A case file, named by its stem."""
    case: Case = json.loads(path.read_text(encoding="utf-8"))
    case.setdefault("name", path.stem)
    return case


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--count", type=int, default=14)
    parser.add_argument("--kinds", default=",".join(KINDS), help="comma list of " + ",".join(KINDS))
    parser.add_argument("--sglang-python", default=DEFAULT_SGLANG_PYTHON)
    parser.add_argument("--dump", action="store_true", help="print the reference reports too")
    parser.add_argument("--cases", nargs="+", type=Path, metavar="CASE.json",
                        help="these case files (e.g. references/sglang_cases/*.json) instead of "
                             "random ones")
    parser.add_argument("--gpu", choices=sorted(GPUS), default=None,
                        help="the GPU every case without one of its own runs on (SGLang's "
                             "CUDA resolution for that compute capability; default: each "
                             "case's own, else an H200, SM90)")
    parser.add_argument("--server-args-fields", action="store_true",
                        help="also draw 1-3 ServerArgs fields beyond the modelled ones into "
                             "each case (sglang_server_args_draw.py; SGLang in this "
                             "interpreter)")
    parser.add_argument("--presets", action="store_true",
                        help="also every preset as `plan PRESET --engine sglang` plans it "
                             "(sglang_presets.py), beside SGLang on its published config")
    args = parser.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        parser.error(f"unknown kinds {unknown}; expected some of {sorted(KINDS)}")

    cases = (make_cases(args.seed, args.count, kinds) if args.cases is None
             else [fixed_case(path) for path in args.cases])
    drawn: dict[str, list[str]] = {}
    if args.server_args_fields:
        drawn = _draw_server_args_fields(args.seed, cases)
    preset_requests: dict[str, PlanRequest] = {}
    if args.presets:
        sys.path.insert(0, str(HERE))
        import sglang_presets

        for case, request in sglang_presets.preset_cases():
            cases.append(case)
            preset_requests[case["name"]] = request
    if args.gpu is not None:
        for case in cases:
            on_gpu(case, GPUS[args.gpu])
    refs = reference_reports(cases, args.sglang_python)
    if refs is None:
        print(
            "SGLang is missing: it does not import here and "
            f"{args.sglang_python} is not a working SGLang interpreter"
        )
        return 2
    ours = our_side()
    if ours is None or args.dump:
        if ours is None:
            print("our side is absent (hisparse_plan.adapters.sglang.report_for_case); "
                  "reference reports follow")
        print(json.dumps([{"case": c, "reference": r} for c, r in zip(cases, refs, strict=True)],
                         indent=1))
        if ours is None:
            return 0
    totals: dict[str, int] = {"agree": 0, "both refuse": 0, UNUSABLE: 0, UNUSABLE_HERE: 0,
                              "mismatch": 0}
    by_mode: dict[str, dict[str, int]] = {}
    per_field: dict[str, dict[str, int]] = {}
    for case, ref in zip(cases, refs, strict=True):
        side = ours
        if case["name"] in preset_requests:
            side = _preset_side(preset_requests[case["name"]])
        verdict = compare(_ours_safely(side, case), ref)
        key = verdict if verdict in totals else "mismatch"
        totals[key] += 1
        for mode in modes_of(case):
            counts = by_mode.setdefault(mode, dict.fromkeys(totals, 0))
            counts[key] += 1
        extra = drawn.get(case["name"])
        fields = "" if not extra else " {" + ", ".join(
            f"{name}={case['server_args'][name]!r}" for name in extra) + "}"
        print(f"{case['name']} [{'+'.join(modes_of(case))}]{fields}: {verdict}")
        for name in extra or ():
            per_field.setdefault(name, dict.fromkeys(totals, 0))[key] += 1
    for mode, counts in sorted(by_mode.items()):
        print(f"  {mode}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    if drawn:
        _field_totals(per_field)
    print(", ".join(f"{k} {v}" for k, v in totals.items()) + f" (of {len(cases)})")
    return 1 if totals["mismatch"] else 0


def _draw_server_args_fields(seed: int, cases: list[Case]) -> dict[str, list[str]]:
    """Each case with 1-3 ignored ServerArgs fields drawn (their names by case), from a random
    stream of its own so that the cases' other draws stay as without the flag."""
    sys.path.insert(0, str(HERE))
    import sglang_server_args_draw

    rng = random.Random(f"server-args-fields-{seed}")
    return {case["name"]: sglang_server_args_draw.draw_fields(rng, case) for case in cases}


def _field_totals(per_field: dict[str, dict[str, int]]) -> None:
    """How many drawn fields ran, and the verdicts of any drawn where a case did not agree."""
    import sglang_server_args_draw

    fields, undrawable = sglang_server_args_draw.drawable_fields()
    print(f"  server_args_fields: {len(per_field)} distinct fields drawn of {len(fields)} "
          f"drawable ({len(undrawable)} ignored fields not drawable: free text, lists, "
          "no flag)")
    for name, counts in sorted(per_field.items()):
        if counts["mismatch"]:
            print(f"    {name}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))


if __name__ == "__main__":
    sys.exit(main())
